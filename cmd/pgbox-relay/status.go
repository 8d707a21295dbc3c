package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/relay"
)

// schemaHint turns "relation does not exist" into advice.
func schemaHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w (the pgbox tables are missing from the search_path: run `pgbox-relay migrate up`, or set --schema)", err)
	}
	return err
}

// cmdStatus prints inspect.Read's snapshot: as text, or with --json as the
// snapshot's JSON (what a service gets from inspect.Read).
func cmdStatus(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("status takes no arguments (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	opts := inspect.Options{Lanes: relay.LanesDefault, Logger: a.log.With("component", "status")}
	if len(a.opts.Kafka.Brokers) > 0 {
		kcfg, err := a.opts.Kafka.saramaConfig()
		if err != nil {
			return err
		}
		lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
		defer lk.Close()
		cc := a.cleanupConfig(nil, lk, true)
		opts.Cutoffs = &cc
	}
	snap, err := inspect.Read(ctx, pool, opts)
	if err != nil {
		return err
	}
	if len(a.opts.Kafka.Brokers) == 0 {
		snap.Cutoffs = "unknown: set KAFKA_BROKERS to compare inbox ages with each topic's retention window"
	}
	if a.opts.JSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(snap)
	}
	printStatus(a.stdout, snap)
	return nil
}

func ageText(s *float64) string {
	if s == nil {
		return "-"
	}
	return durText(time.Duration(*s * float64(time.Second)))
}

func countText(n int64, estimated bool) string {
	if estimated {
		return fmt.Sprintf("~%d", n)
	}
	return fmt.Sprint(n)
}

func printStatus(w io.Writer, s *inspect.Snapshot) {
	fmt.Fprintf(w, "pgbox status at %s\n", s.Time.Format(time.RFC3339))
	printOutbox(w, s)
	printRelays(w, s)
	printInbox(w, s)
}

func printOutbox(w io.Writer, s *inspect.Snapshot) {
	parked := countText(s.Outbox.Parked, false)
	if s.Outbox.ParkedCapped {
		parked = ">=" + parked
	}
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
		fmt.Fprintln(w, "\nPARKED ROWS (newest; fix the cause, then UPDATE pgbox_outbox SET parked_at = NULL, attempts = 0 WHERE id = … to retry):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT ID\tTOPIC\tATTEMPTS\tPARKED AT\tLAST ERROR")
		for _, p := range s.Parked {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.EventID, p.Topic, p.Attempts, p.ParkedAt.UTC().Format(time.RFC3339), truncate(p.LastError, 80))
		}
		_ = tw.Flush()
	}
}

func printRelays(w io.Writer, s *inspect.Snapshot) {
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
			state := "live"
			if !i.Live {
				state = "expired"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\n", i.Instance, state, held[i.Instance], i.StartedAt.UTC().Format(time.RFC3339),
				durText(s.Time.Sub(i.HeartbeatAt)))
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
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", l.Lane, owner, l.Epoch, durText(time.Duration(l.ExpiresIn*float64(time.Second))), ageText(ages[l.Lane]))
		}
		_ = tw.Flush()
	}
}

func printInbox(w io.Writer, s *inspect.Snapshot) {
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
			fmt.Fprintf(tw, "%s\t%s\t%d\n", d.Consumer, d.Topic, d.Count)
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
