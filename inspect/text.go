package inspect

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/pgbox/pgbox/internal/durtext"
)

func ageText(s *float64) string {
	if s == nil {
		return "-"
	}
	return durtext.Short(time.Duration(*s * float64(time.Second)))
}

func countText(n int64, estimated bool) string {
	if estimated {
		return fmt.Sprintf("~%d", n)
	}
	return fmt.Sprint(n)
}

// cappedText shows a count that stopped at a limit as a lower bound
// (">=1000").
func cappedText(n int64, capped bool) string {
	if capped {
		return ">=" + fmt.Sprint(n)
	}
	return fmt.Sprint(n)
}

// WriteText prints the snapshot for people, as `relay status` does.
func (s *Snapshot) WriteText(w io.Writer) {
	fmt.Fprintf(w, "pgbox status at %s\n", s.Time.Format(time.RFC3339))
	printOutbox(w, s)
	printRelays(w, s)
	printInbox(w, s)
	printHorizon(w, s)
}

func printOutbox(w io.Writer, s *Snapshot) {
	parked := cappedText(s.Outbox.Parked, s.Outbox.ParkedCapped)
	fmt.Fprintf(w, "\nOUTBOX: %s unpublished, %s parked, oldest unpublished %s (lanes: %d)\n",
		countText(s.Outbox.Unpublished, s.Outbox.Estimated), parked, ageText(s.Outbox.OldestAge), s.LaneCount)
	if s.Outbox.Estimated {
		fmt.Fprintln(w, "  (~: planner estimates, per topic; the backlog is too large to count on every call)")
	}
	if len(s.Topics) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tLANE\tUNPUBLISHED")
		for _, b := range s.Topics {
			lane := fmt.Sprint(b.Lane)
			if b.Lane < 0 {
				lane = "all"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", b.Topic, lane, countText(b.Unpublished, b.Estimated))
		}
		_ = tw.Flush()
	}
	if len(s.Parked) > 0 {
		fmt.Fprintln(w, "\nPARKED ROWS (newest; each holds back its key's later rows, HELD: fix the cause, then `relay parked retry ID`, or `relay parked discard ID`):")
		if slices.ContainsFunc(s.Parked, func(p ParkedRow) bool { return p.HeldCapped }) {
			fmt.Fprintln(w, "  (HELD >=n: at least n; the count reads a bounded number of the rows after the parked row in its slot, and stopped there)")
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT ID\tTOPIC\tATTEMPTS\tHELD\tPARKED AT\tLAST ERROR")
		for _, p := range s.Parked {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", p.ID, p.EventID, p.Topic, p.Attempts, cappedText(p.Held, p.HeldCapped), p.ParkedAt.UTC().Format(time.RFC3339), truncate(p.LastError, 80))
		}
		_ = tw.Flush()
	}
}

// instanceState says whether an instance runs and whether it reaches Kafka.
func instanceState(s *Snapshot, i Instance) string {
	switch {
	case !i.Live:
		return "expired"
	case i.KafkaDownSince != nil:
		return fmt.Sprintf("running, Kafka unreachable since %s (%s)", i.KafkaDownSince.UTC().Format(time.RFC3339),
			durtext.Short(s.Time.Sub(*i.KafkaDownSince)))
	case i.Dormant:
		return "live, dormant (found no rows for a while: holds no lanes until the fleet's poll or a NOTIFY finds rows)"
	case !i.KafkaReady:
		return "running, connecting to Kafka"
	case i.Sleeping:
		return "live, asleep (found no rows lately: polls every poll interval, a NOTIFY wakes it sooner)"
	default:
		return "live, awake"
	}
}

func printRelays(w io.Writer, s *Snapshot) {
	held := map[string]int{}
	free := 0
	for _, l := range s.Lanes {
		if l.Held {
			held[l.Owner]++
		} else {
			free++
		}
	}
	fmt.Fprintf(w, "\nRELAY INSTANCES (%d lanes, %d unowned):\n", len(s.Lanes), free)
	if len(s.Instances) == 0 {
		fmt.Fprintln(w, "  none running (an instance removes itself when it stops)")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "INSTANCE\tSTATE\tLANES HELD\tSTARTED\tLAST HEARTBEAT")
		for _, i := range s.Instances {
			state := instanceState(s, i)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\n", i.Instance, state, held[i.Instance], i.StartedAt.UTC().Format(time.RFC3339),
				durtext.Short(s.Time.Sub(i.HeartbeatAt)))
		}
		_ = tw.Flush()
	}
	if len(s.Lanes) > 0 {
		ages := map[int]*float64{}
		for _, l := range s.LaneAges {
			ages[l.Lane] = l.OldestAge
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "LANE\tOWNER\tEPOCH\tLEASE LEFT\tOLDEST UNPUBLISHED")
		for _, l := range s.Lanes {
			owner := l.Owner
			if !l.Held {
				owner = "(free)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", l.Lane, owner, l.Epoch, durtext.Short(time.Duration(l.ExpiresIn*float64(time.Second))), ageText(ages[l.Lane]))
		}
		_ = tw.Flush()
	}
}

func printInbox(w io.Writer, s *Snapshot) {
	fmt.Fprintf(w, "\nINBOX (cutoffs %s):\n", s.Cutoffs)
	if len(s.Inbox) == 0 {
		fmt.Fprintln(w, "  no keys")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tTOPIC\tKEYS\tOLDEST KEY AGE\tWINDOW\tMARGIN\tNOTE")
		for _, i := range s.Inbox {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", i.Consumer, i.Topic, countText(i.Keys, i.Estimated), ageText(&i.OldestAge), ageText(i.Window), ageText(i.Margin), i.Note)
		}
		_ = tw.Flush()
	}
	if len(s.Dead) > 0 {
		fmt.Fprintln(w, "\nDEAD LETTERS (consumer adapter):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tTOPIC\tCOUNT")
		for _, d := range s.Dead {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", d.Consumer, d.Topic, cappedText(d.Count, d.Capped))
		}
		_ = tw.Flush()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
