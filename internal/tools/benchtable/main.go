// Command benchtable reads `go test -bench` output on stdin, echoes it, and then
// prints a table: one row per benchmark, with every reported metric, and for
// each sub-benchmark whose sibling is named "baseline", its speed relative to
// that baseline from the same run (>1 means faster than the baseline).
//
// Speed is the first rate-like metric the benchmark reports (a unit ending in
// "/s"), else 1/(ns/op).
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

func (r result) speed() (float64, bool) {
	for _, m := range r.metrics {
		if strings.HasSuffix(m.unit, "/s") && m.value > 0 {
			return m.value, true
		}
	}
	for _, m := range r.metrics {
		if m.unit == "ns/op" && m.value > 0 {
			return 1 / m.value, true
		}
	}
	return 0, false
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
				s, ok1 := r.speed()
				bs, ok2 := b.speed()
				if ok1 && ok2 {
					ratio = fmt.Sprintf("%.2fx", s/bs)
				}
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
