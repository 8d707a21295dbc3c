// Command benchtable reads `go test -bench` output on stdin, echoes it, and then
// prints a table: one row per benchmark, with pgbox, baseline and ratio
// columns, then every reported metric. A benchmark that measures both sides
// itself, interleaved, reports them as the metrics "pgbox-<unit>" and
// "baseline-<unit>" and its ratio as "x-baseline" (or "<what>-ratio"), shown
// as is; for a sub-benchmark whose sibling is named "baseline" the ratio of
// every metric both report is computed. For a rate (msgs/s) above 1 is
// better, for a latency (p99-ms) below 1 is.
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

// resultTail is a result line without its name: "   2   123 ns/op ...".
var resultTail = regexp.MustCompile(`^\s+\d+\s+[0-9.e+]+ ns/op`)

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
	var pending string // a benchmark's name whose result line a log line cut off
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		// A benchmark's name is printed before it runs and its figures after;
		// what it logs meanwhile lands between the two.
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "Benchmark") {
			if _, err := strconv.Atoi(f[1]); err != nil {
				pending = f[0]
				continue
			}
		}
		if pending != "" && resultTail.MatchString(line) {
			line, pending = pending+" "+line, ""
		}
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
	if d := os.Getenv("PGBOX_BENCH_DELAY"); d != "" {
		fmt.Printf("== pgbox benchmarks (vs baseline = same run), PostgreSQL behind a proxy adding %s each way ==\n", d)
	} else {
		fmt.Println("== pgbox benchmarks (vs baseline = same run), PostgreSQL on loopback ==")
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tpgbox\tbaseline\tratio\tmetrics")
	for _, r := range results {
		ratio := ""
		if p := parent(r.name); p != "" && !strings.HasSuffix(r.name, "/baseline") {
			if b, ok := byName[p+"/baseline"]; ok {
				ratio = ratios(r, b)
			}
		}
		pg, base := sides(r)
		for _, m := range r.metrics {
			if m.unit == "x-baseline" || (ratio == "" && strings.HasSuffix(m.unit, "-ratio")) {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.TrimPrefix(r.name, "Benchmark"), pg, base, ratio, strings.Join(ms, ", "))
	}
	_ = tw.Flush()
}

// sides returns the first pair of metrics "pgbox-U" and "baseline-U" that r
// reports, formatted with their unit U, or "" when it reports none.
func sides(r result) (pg, base string) {
	vals := map[string]float64{}
	for _, m := range r.metrics {
		vals[m.unit] = m.value
	}
	for _, m := range r.metrics {
		u, ok := strings.CutPrefix(m.unit, "pgbox-")
		if !ok {
			continue
		}
		if bv, ok := vals["baseline-"+u]; ok {
			f := func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) + " " + u }
			return f(m.value), f(bv)
		}
	}
	return "", ""
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
