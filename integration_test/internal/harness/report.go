package harness

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Print writes the report as tables: the verdict, then per fault kind the
// count and recovery times, then every fault in order.
func (r *Report) Print(out io.Writer) {
	v := r.Verdict
	mark := func(n int64) string {
		if n == 0 {
			return "ok"
		}
		return "FAIL"
	}
	fmt.Fprintf(out, "\npgbox chaos run: seed %d (replay: CHAOS_SEED=%d), %d events, %d faults, %v\n\n",
		r.Seed, r.Seed, r.Config.Events, len(r.Faults), r.Took.Round(time.Second))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "events produced (orders committed)\t%d\t\n", v.Produced)
	fmt.Fprintf(tw, "business effects (payments rows)\t%d\t\n", v.Effects)
	for _, c := range slices.Sorted(maps.Keys(v.ByClient)) {
		fmt.Fprintf(tw, "  of which committed by the %s member(s)\t%d\t\n", c, v.ByClient[c])
	}
	fmt.Fprintf(tw, "LOST events\t%d\t%s\n", v.Lost, mark(v.Lost))
	fmt.Fprintf(tw, "DUPLICATE business effects\t%d\t%s\n", v.DuplicateEffects, mark(v.DuplicateEffects))
	fmt.Fprintf(tw, "per-key ORDER INVERSIONS\t%d\t%s\n", v.OrderInversions, mark(v.OrderInversions))
	fmt.Fprintf(tw, "dead letters / parked outbox rows\t%d / %d\t%s\n", v.DeadLetters, v.Parked, mark(v.DeadLetters+v.Parked))
	fmt.Fprintf(tw, "rows the relays' sweeps found below a floor\t%d\t%s\n", v.BelowFloor, mark(v.BelowFloor))
	fmt.Fprintf(tw, "downstream records (payments topic)\t%d\t\n", v.DownstreamRecs)
	fmt.Fprintf(tw, "duplicate Kafka records (allowed)\t%d\t\n", v.DuplicateRecords)
	fmt.Fprintf(tw, "inbox keys deleted by cleanup\t%d\t\n", r.InboxDeleted)
	fmt.Fprintf(tw, "records redelivered by rewinds\t%d\t\n", r.Redelivered)
	_ = tw.Flush()

	fmt.Fprintln(out, "\nFAULT KIND                      COUNT  RECOVERY min / median / max")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, k := range AllFaults {
		var ds []time.Duration
		for _, f := range r.Faults {
			if f.Kind == k {
				ds = append(ds, f.Recovery)
			}
		}
		if len(ds) == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\n", k)
			continue
		}
		slices.Sort(ds)
		fmt.Fprintf(tw, "%s\t%d\t%v / %v / %v\n", k, len(ds), rd(ds[0]), rd(ds[len(ds)/2]), rd(ds[len(ds)-1]))
	}
	_ = tw.Flush()

	fmt.Fprintln(out, "\nFAULTS IN ORDER")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for i, f := range r.Faults {
		fmt.Fprintf(tw, "%d\t%v\t%s\trecovered in %v\t%s\n", i+1, f.At.Round(time.Second), f.Kind, rd(f.Recovery), f.Detail)
	}
	_ = tw.Flush()
	for _, s := range []struct {
		title string
		lines []string
	}{{"VIOLATIONS (first)", append(slices.Clone(r.Violations), v.First...)}, {"STALLS", r.Stalls}, {"PROCESS EXITS (restarted)", r.Exits}} {
		if len(s.lines) > 0 {
			fmt.Fprintf(out, "\n%s\n  %s\n", s.title, strings.Join(s.lines, "\n  "))
		}
	}
	if r.Err != nil {
		fmt.Fprintf(out, "\nINCOMPLETE: %v\n", r.Err)
	}
	if r.OK() {
		fmt.Fprintln(out, "\nPASS: 0 lost, 0 duplicate effects, 0 order inversions")
	} else {
		fmt.Fprintf(out, "\nFAIL. Process logs (kept):\n  %s\n", strings.Join(r.Logs, "\n  "))
	}
}

func rd(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
