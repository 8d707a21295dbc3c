// Command benchtable reads `go test -bench` output on stdin, echoes it, and then
// prints a table: one row per benchmark, with every reported metric, and for
// each sub-benchmark whose sibling is named "baseline" (measured in the same
// run), the ratio pgbox/baseline of every metric both report — for a rate
// (msgs/s) above 1 is better, for a latency (p99-ms) or a cost (queries/s)
// below 1 is. A benchmark that measures both sides itself (interleaved) reports
// its own ratio as the metric "x-baseline", shown as is.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
)

type metric struct {
	value float64
	unit  string
}

type result struct {
	name    string // without the -GOMAXPROCS suffix
	metrics []metric
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

func parse(line string) (result, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return result{}, false
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return result{}, false
	}
	r := result{name: procsSuffix.ReplaceAllString(f[0], "")}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			break
		}
		r.metrics = append(r.metrics, metric{v, f[i+1]})
	}
	return r, len(r.metrics) > 0
}

func parent(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[:i]
	}
	return ""
}

func main() {
	var results []result
	byName := map[string]result{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		if r, ok := parse(line); ok {
			results = append(results, r)
			byName[r.name] = r
		}
	}
	if len(results) == 0 {
		fmt.Println("\nbenchtable: no benchmark results read")
		os.Exit(1)
	}
	fmt.Println()
	fmt.Println("== pgbox benchmarks (vs baseline = same run) ==")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tvs baseline\tmetrics")
	for _, r := range results {
		ratio := ""
		if p := parent(r.name); p != "" && !strings.HasSuffix(r.name, "/baseline") {
			if b, ok := byName[p+"/baseline"]; ok {
				ratio = ratios(r, b)
			}
		}
		for _, m := range r.metrics {
			if m.unit == "x-baseline" {
				ratio = fmt.Sprintf("%.2fx", m.value)
			}
		}
		if strings.HasSuffix(r.name, "/baseline") {
			ratio = "(baseline)"
		}
		var ms []string
		for _, m := range r.metrics {
			ms = append(ms, fmt.Sprintf("%s %s", strconv.FormatFloat(m.value, 'g', 6, 64), m.unit))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.TrimPrefix(r.name, "Benchmark"), ratio, strings.Join(ms, ", "))
	}
	_ = tw.Flush()
}

// ratios compares every metric r and its baseline b both report, skipping
// ns/op when they share anything more telling.
func ratios(r, b result) string {
	base := map[string]float64{}
	for _, m := range b.metrics {
		base[m.unit] = m.value
	}
	var out []string
	nsop := ""
	for _, m := range r.metrics {
		bv, ok := base[m.unit]
		if !ok || bv == 0 {
			continue
		}
		s := fmt.Sprintf("%s %.2fx", m.unit, m.value/bv)
		if m.unit == "ns/op" {
			nsop = s
			continue
		}
		out = append(out, s)
	}
	if len(out) == 0 && nsop != "" {
		out = append(out, nsop)
	}
	return strings.Join(out, "; ")
}
