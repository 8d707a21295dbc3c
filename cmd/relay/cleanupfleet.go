package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/dbconf"
)

// `relay cleanup` over a target list: one pass on every target, each on a
// pool of its own (its schema as search_path) under its schema's cleanup
// lease, --targets-concurrency at a time, over one Kafka client; a line per
// target, a failure not stopping the others.

const cleanupDoc = `Run one cleanup pass and print its report: inbox keys Kafka can no longer
redeliver (the partition's log start offset past the key's offset, and older
than --cleanup-buffer; retention.ms + segment.ms + buffer for keys of unknown
position), dead letters past --keep-dead-letters, attempt rows past --keep-attempts.
With a target list (--targets or --targets-query), run one pass on every
target, --targets-concurrency at a time, each under its own schema's cleanup
lease and all over one Kafka client, and print one line per target: NAME,
SCHEMA, DATABASE and RESULT (the rows deleted and the topics not pruned, with
why; "skipped" when another cleaner holds the target's lease; "failed" with
the error). A failed target does not stop the others; the command then exits 1.`

// cleanupTargetConns is each target's pool: the pass's connection, and one
// for the checks before it and the lease's release after a cancellation.
const cleanupTargetConns = 3

// cleanupTargets runs `relay cleanup` on every target of the list.
func cleanupTargets(ctx context.Context, a *app) error {
	list, err := loadTargets(ctx, a)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintf(a.stdout, "no targets: %s lists none\n", a.opts.Targets.sourceSetting())
		return nil
	}
	kcfg, err := a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
	defer lk.Close()
	kafka := &onceKafka{lk: lk}
	results := make([]targetResult, len(list))
	for i := range results {
		results[i].err = errors.New("interrupted before it started")
	}
	onTargets(ctx, len(list), a.opts.Targets.EachConcurrency, func(i int) {
		t := list[i]
		log := a.log.With("target", t.Name, "schema", t.Schema)
		log.Info("cleanup: target started", "database", dbconf.RedactDSN(t.DatabaseURL))
		_, res, err := cleanTarget(ctx, a, t, kafka, log)
		if err != nil {
			err = errors.New(dbconf.RedactErr(err, t.DatabaseURL))
			log.Warn("cleanup: target failed", "err", err)
		} else {
			log.Info("cleanup: target done", "result", res)
		}
		results[i] = targetResult{cols: []string{res}, err: err}
	})
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSCHEMA\tDATABASE\tRESULT")
	failed := 0
	for i, t := range list {
		res := strings.Join(results[i].cols, " ")
		if err := results[i].err; err != nil {
			failed++
			res = "failed: " + oneLine(err.Error())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.display(), t.Schema, dbconf.RedactDSN(t.DatabaseURL), res)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d targets failed (see the table); the others' passes ran", failed, len(list))
	}
	return nil
}

// cleanTarget runs one pass on the target and says what it did; rep is
// the pass's report (zero when it failed before the pass).
func cleanTarget(ctx context.Context, a *app, t targetSpec, kafka *onceKafka, log *logger) (rep cleanup.Report, result string, err error) {
	pool, err := openTarget(ctx, t, cleanupTargetConns)
	if err != nil {
		return rep, "", err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, t); err != nil {
		return rep, "", err
	}
	if err := checkPgboxTables(ctx, pool, "", 0); err != nil {
		return rep, "", err
	}
	cfg := a.cleanupConfig(pool, kafka, a.opts.DryRun)
	cfg.Logger = log.With("component", "cleanup")
	c, err := cleanup.New(cfg)
	if err != nil {
		return rep, "", err
	}
	rep, err = c.RunOnce(ctx)
	if err != nil {
		if rep.Deleted > 0 {
			return rep, "", &partialPass{err: err, deleted: rep.Deleted}
		}
		return rep, "", err
	}
	return rep, passResult(rep), nil
}

// partialPass is a pass that failed after it had deleted rows.
type partialPass struct {
	err     error
	deleted int64
}

func (p *partialPass) Error() string {
	return fmt.Sprintf("%v (the pass had deleted %d rows before it failed)", p.err, p.deleted)
}

func (p *partialPass) Unwrap() error { return p.err }

// passResult is a pass's line: what it deleted (or would), and the topics
// it did not prune, each with its reason.
func passResult(rep cleanup.Report) string {
	if rep.Locked {
		return "skipped: another cleaner holds this target's lease (pgbox_cleanup_lease); it prunes the target now"
	}
	keys, rows := passTotals(rep)
	s := fmt.Sprintf("deleted %d rows (%d inbox keys, %d other rows)", keys+rows, keys, rows)
	if rep.DryRun {
		s = fmt.Sprintf("dry run: would delete %d rows (%d inbox keys, %d other rows)", keys+rows, keys, rows)
	}
	var skipped []string
	for _, t := range rep.Skipped() {
		when := "never"
		if t.Reason.Transient() {
			when = "this pass"
		}
		skipped = append(skipped, fmt.Sprintf("%s (%s: %s)", t.Topic, when, t.Reason))
	}
	if len(skipped) > 0 {
		s += "; not pruned: " + strings.Join(skipped, ", ")
	}
	return s
}

// passTotals sums the inbox keys and the other rows a pass deleted (a dry
// run: would delete).
func passTotals(rep cleanup.Report) (keys, rows int64) {
	count := func(deleted, would int64) int64 {
		if rep.DryRun {
			return would
		}
		return deleted
	}
	for _, t := range rep.Topics {
		keys += count(t.Deleted, t.WouldDelete)
	}
	for _, t := range rep.Tables {
		rows += count(t.Deleted, t.WouldDelete)
	}
	return keys, rows
}

// onceKafka is the one Kafka client of a cleanup over a target list: it
// connects on first use, and when that fails every target's pass gets the
// same error at once (their inbox topics "not pruned this pass: Kafka
// unreachable") instead of waiting for a connection of its own.
type onceKafka struct {
	lk *lazyKafka

	mu    sync.Mutex
	tried bool
	err   error
}

func (o *onceKafka) admin() (sarama.ClusterAdmin, error) {
	o.mu.Lock()
	if !o.tried {
		o.tried = true
		_, _, o.err = o.lk.connect()
	}
	err := o.err
	o.mu.Unlock()
	if err != nil {
		return nil, err
	}
	_, a, err := o.lk.connect()
	return a, err
}

func (o *onceKafka) DescribeConfigs(res []*sarama.ConfigResource, opts sarama.DescribeConfigsOptions) ([]*sarama.ConfigResourceResult, error) {
	a, err := o.admin()
	if err != nil {
		return nil, err
	}
	return a.DescribeConfigs(res, opts)
}

func (o *onceKafka) DescribeTopics(topics []string) ([]*sarama.TopicMetadata, error) {
	a, err := o.admin()
	if err != nil {
		return nil, err
	}
	return a.DescribeTopics(topics)
}

func (o *onceKafka) ListOffsets(partitions map[string]map[int32]int64, opts *sarama.ListOffsetsOptions) (map[string]map[int32]*sarama.OffsetResult, error) {
	a, err := o.admin()
	if err != nil {
		return nil, err
	}
	return a.ListOffsets(partitions, opts)
}
