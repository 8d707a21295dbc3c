package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/durtext"
)

// cleanupConfig maps the cleanup settings onto cleanup.Config.
func (a *app) cleanupConfig(pool *pgxpool.Pool, admin cleanup.ConfigDescriber, dryRun bool) cleanup.Config {
	o := a.opts
	buffer := o.CleanupBuffer
	if buffer == 0 { // an explicit 0s: zero means zero
		buffer = cleanup.NoBuffer
	}
	return cleanup.Config{
		Pool:         pool,
		Admin:        admin,
		Buffer:       buffer,
		Window:       o.CleanupWindow,
		BatchSize:    o.CleanupBatchSize,
		Pause:        o.CleanupPause,
		Interval:     o.CleanupInterval,
		KafkaTimeout: o.Kafka.Timeout,
		DryRun:       dryRun,
		Tables:       cleanup.Tables{Parked: o.KeepParked, DeadLetters: o.KeepDeadLetters, Attempts: o.KeepAttempts},
		Logger:       a.log.With("component", "cleanup"),
	}
}

func cmdCleanup(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("cleanup takes no arguments (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	kcfg, err := a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	// Kafka unreachable is not a failure of the pass: its topics are skipped
	// with the reason (nothing is deleted for them) and the pass goes on.
	lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
	defer lk.Close()
	c, err := cleanup.New(a.cleanupConfig(pool, lk, a.opts.DryRun))
	if err != nil {
		return err
	}
	rep, err := c.RunOnce(ctx)
	printCleanupReport(a.stdout, rep)
	return err
}

func printCleanupReport(w io.Writer, rep cleanup.Report) {
	what := "deleted"
	if rep.DryRun {
		what = "would delete (dry run)"
	}
	if rep.Locked {
		fmt.Fprintln(w, "cleanup: another cleaner holds the lock; this pass did nothing")
		return
	}
	fmt.Fprintf(w, "cleanup pass at %s took %s: %d rows deleted in %d batches (longest %s)\n",
		rep.Start.UTC().Format(time.RFC3339), rep.Duration.Round(time.Millisecond), rep.Deleted, rep.Batches, rep.MaxBatch.Round(time.Millisecond))
	if len(rep.Topics) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "\nINBOX TOPIC\tRETENTION\tSEGMENT\tPOLICY\tWINDOW\t%s\tOLDEST KEY AGE\tMARGIN\tNOTE\n", upper(what))
		for _, t := range rep.Topics {
			n := t.Deleted
			if rep.DryRun {
				n = t.WouldDelete
			}
			note := ""
			switch {
			case t.Skipped:
				note = "skipped: " + string(t.Reason)
			case t.Forced:
				note = "forced window (" + string(t.Reason) + ")"
			}
			if t.Err != nil {
				note += ": " + t.Err.Error()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Topic, msText(t.RetentionMs), msText(t.SegmentMs), dash(t.CleanupPolicy),
				durtext.Short(t.Window), n, durtext.Short(t.OldestAge), durtext.Short(t.Margin), note)
		}
		_ = tw.Flush()
	}
	if len(rep.Tables) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "\nTABLE\tKEEP\tCUTOFF\t%s\n", upper(what))
		for _, t := range rep.Tables {
			n := t.Deleted
			if rep.DryRun {
				n = t.WouldDelete
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", t.Name, durtext.Short(t.Keep), t.Cutoff.UTC().Format(time.RFC3339), n)
		}
		_ = tw.Flush()
	}
}

func upper(s string) string { return strings.ToUpper(s) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func msText(ms int64) string {
	switch {
	case ms == 0:
		return "-"
	case ms < 0:
		return "forever"
	}
	return durtext.Short(time.Duration(ms) * time.Millisecond)
}
