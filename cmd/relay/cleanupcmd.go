package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/internal/durtext"
)

// cleanupConfig maps the cleanup settings onto cleanup.Config; the cleaner
// reads Kafka through admin (the binary's sarama client).
func (a *app) cleanupConfig(pool *pgxpool.Pool, admin cleanupsarama.ClusterAdmin, dryRun bool) cleanup.Config {
	o := a.opts
	buffer := o.CleanupBuffer
	if buffer == 0 { // an explicit 0s: zero means zero
		buffer = cleanup.NoBuffer
	}
	pause := o.CleanupPause
	if pause == 0 { // an explicit 0s: no pause
		pause = cleanup.NoPause
	}
	return cleanup.Config{
		Pool:         pool,
		Admin:        cleanupsarama.New(admin),
		Buffer:       buffer,
		Window:       o.CleanupWindow,
		BatchSize:    o.CleanupBatchSize,
		Pause:        pause,
		Interval:     o.CleanupInterval,
		KafkaTimeout: o.Kafka.Timeout,
		DryRun:       dryRun,
		Tables:       cleanup.Tables{Parked: o.KeepParked, DeadLetters: o.KeepDeadLetters, Attempts: o.KeepAttempts},
		Logger:       a.log.With("component", "cleanup"),
	}
}

// DescribeTopics and ListOffsets (with DescribeConfigs) make lazyKafka a
// cleanupsarama.ClusterAdmin: it connects on first use.
func (l *lazyKafka) DescribeTopics(topics []string) ([]*sarama.TopicMetadata, error) {
	_, a, err := l.connect()
	if err != nil {
		return nil, err
	}
	return a.DescribeTopics(topics)
}

func (l *lazyKafka) ListOffsets(partitions map[string]map[int32]int64, opts *sarama.ListOffsetsOptions) (map[string]map[int32]*sarama.OffsetResult, error) {
	_, a, err := l.connect()
	if err != nil {
		return nil, err
	}
	return a.ListOffsets(partitions, opts)
}

func cmdCleanup(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("cleanup takes no arguments (got %q)", args)
	}
	if a.opts.Targets.listed() {
		return cleanupTargets(ctx, a)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := refuseOlderSchema(ctx, pool); err != nil {
		return err
	}
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
	if err != nil {
		// No report: its first line reads as a pass that ran. What a failed
		// pass deleted before the error stays deleted; say how much.
		if rep.Deleted > 0 {
			return fmt.Errorf("%w (the pass had deleted %d rows before it failed)", err, rep.Deleted)
		}
		return err
	}
	printCleanupReport(a.stdout, rep)
	return nil
}

// printCleanupReport prints the pass's totals, then one row per inbox topic
// and per other table, each table ending in a TOTAL row.
func printCleanupReport(w io.Writer, rep cleanup.Report) {
	if rep.Locked {
		fmt.Fprintln(w, "cleanup: another cleaner holds the lock; this pass did nothing")
		return
	}
	count := func(deleted, would int64) int64 {
		if rep.DryRun {
			return would
		}
		return deleted
	}
	keys, rows := passTotals(rep)
	at := rep.Start.UTC().Format(time.RFC3339)
	what := "DELETED"
	if rep.DryRun {
		what = "WOULD DELETE (DRY RUN)"
		fmt.Fprintf(w, "cleanup dry run at %s took %s: would delete %d rows (%d inbox keys, %d other rows); nothing was deleted\n",
			at, rep.Duration.Round(time.Millisecond), keys+rows, keys, rows)
	} else {
		fmt.Fprintf(w, "cleanup pass at %s took %s: %d rows deleted (%d inbox keys, %d other rows) in %d batches (longest %s)\n",
			at, rep.Duration.Round(time.Millisecond), rep.Deleted, keys, rows, rep.Batches, rep.MaxBatch.Round(time.Millisecond))
	}
	if len(rep.Topics) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "\nINBOX TOPIC\tRETENTION\tSEGMENT\tPOLICY\tTIME WINDOW\t%s\tBY EXACT RULE\tBY TIME RULE\tLOG START\tOLDEST KEY AGE\tMARGIN\tNOTE\n", what)
		var exact, timed int64
		for _, t := range rep.Topics {
			e, tm := count(t.ExactDeleted, t.ExactWouldDelete), count(t.TimeDeleted, t.TimeWouldDelete)
			exact, timed = exact+e, timed+tm
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", t.Topic, msText(t.RetentionMs), msText(t.SegmentMs), cmp.Or(t.CleanupPolicy, "-"),
				durtext.Short(t.Window), e+tm, e, tm, logStartText(t.LogStarts), durtext.Short(t.OldestAge), durtext.Short(t.Margin), t.Note())
		}
		fmt.Fprintf(tw, "TOTAL\t\t\t\t\t%d\t%d\t%d\t\t\t\t\n", keys, exact, timed)
		_ = tw.Flush()
	}
	if len(rep.Tables) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "\nTABLE\tKEEP\tCUTOFF\t%s\n", what)
		for _, t := range rep.Tables {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", t.Name, durtext.Short(t.Keep), t.Cutoff.UTC().Format(time.RFC3339), count(t.Deleted, t.WouldDelete))
		}
		fmt.Fprintf(tw, "TOTAL\t\t\t%d\n", rows)
		_ = tw.Flush()
	}
}

// logStartText prints the log start offsets the exact rule used, by
// partition ("0:120,1:98"), or "-" when Kafka gave none.
func logStartText(starts map[int32]int64) string {
	if len(starts) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, p := range slices.Sorted(maps.Keys(starts)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d:%d", p, starts[p])
	}
	return b.String()
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
