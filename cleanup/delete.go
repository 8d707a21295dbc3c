package cleanup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/pgerr"
)

// pruneTopic applies a topic's plan: the exact rule, then the time rule;
// then it reads the topic's oldest key left.
func (p *pass) pruneTopic(ctx context.Context, tr *TopicReport) error {
	if tr.Exact {
		if err := p.pruneExact(ctx, tr); err != nil {
			return fmt.Errorf("delete keys of topic %q past its log start offsets: %w", tr.Topic, err)
		}
	}
	if tr.Timed {
		if err := p.pruneTimed(ctx, tr); err != nil {
			return fmt.Errorf("delete keys of topic %q past the time cutoff: %w", tr.Topic, err)
		}
	}
	tr.Deleted = tr.ExactDeleted + tr.TimeDeleted
	tr.WouldDelete = tr.ExactWouldDelete + tr.TimeWouldDelete

	var oldest pgtype.Timestamptz
	err := p.conn.QueryRow(ctx, sqlOldestInbox, tr.Topic).Scan(&oldest)
	switch {
	case err == nil:
		tr.Oldest = oldest.Time
		tr.OldestAge = p.rep.Now.Sub(oldest.Time)
		if tr.Timed {
			tr.Margin = tr.Window - tr.OldestAge
		}
	case errors.Is(err, errNoRows):
	default:
		return fmt.Errorf("read oldest key of topic %q: %w", tr.Topic, err)
	}
	return nil
}

// pruneExact applies the exact rule, partition by partition, along
// pgbox_inbox_position_idx: only the keys behind the log start are read.
func (p *pass) pruneExact(ctx context.Context, tr *TopicReport) error {
	cfg := &p.c.cfg
	for _, part := range slices.Sorted(maps.Keys(tr.LogStarts)) {
		start := tr.LogStarts[part]
		if start <= 0 {
			continue // nothing is behind it (a compact-only or young topic)
		}
		if cfg.DryRun {
			var n int64
			if err := p.conn.QueryRow(ctx, sqlCountInboxExact, tr.Topic, part, start, tr.ExactCutoff).Scan(&n); err != nil {
				return fmt.Errorf("partition %d: %w", part, err)
			}
			tr.ExactWouldDelete += n
			continue
		}
		gone, err := deleteLoop[pgtype.Int8](ctx, p, keysetDelete{
			topic: tr.Topic, q: sqlDeleteInboxExact, qSkipLocked: sqlDeleteInboxExactSkipLocked,
			args: []any{tr.Topic, part, int64(math.MinInt64), start, tr.ExactCutoff, cfg.BatchSize}, next: 2,
		})
		tr.ExactDeleted += gone
		if err != nil {
			return fmt.Errorf("partition %d: %w", part, err)
		}
	}
	return nil
}

// pruneTimed applies the time rule, oldest first along
// pgbox_inbox_consumer_topic_age_idx, each batch merging the topic's
// consumers' keys by age (inboxDeleteBatch): to the keys of unknown
// position, or to every key under a forced window. The consumers are read
// once: one that appears later has only keys younger than the cutoff.
func (p *pass) pruneTimed(ctx context.Context, tr *TopicReport) error {
	all := tr.Forced
	if p.c.cfg.DryRun {
		// Keys the exact rule would take are not counted twice.
		parts := slices.Sorted(maps.Keys(tr.LogStarts))
		starts := make([]int64, len(parts))
		for i, p := range parts {
			starts[i] = tr.LogStarts[p]
		}
		return p.conn.QueryRow(ctx, sqlCountInboxTimed, tr.Topic, tr.Cutoff, all, parts, starts, tr.ExactCutoff).Scan(&tr.TimeWouldDelete)
	}
	rows, err := p.conn.Query(ctx, sqlTopicConsumers, tr.Topic)
	if err != nil {
		return fmt.Errorf("list its consumers: %w", err)
	}
	consumers, err := pgxCollectStrings(rows)
	if err != nil {
		return fmt.Errorf("list its consumers: %w", err)
	}
	if len(consumers) == 0 {
		return nil
	}
	lower := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	args := []any{tr.Topic, lower, tr.Cutoff, p.c.cfg.BatchSize, all}
	for _, c := range consumers {
		args = append(args, c)
	}
	gone, err := deleteLoop[pgtype.Timestamptz](ctx, p, keysetDelete{
		topic: tr.Topic, q: inboxDeleteBatch("", len(consumers)), qSkipLocked: inboxDeleteBatch(skipLocked, len(consumers)),
		args: args, next: 1,
	})
	tr.TimeDeleted += gone
	return err
}

// keysetDelete is one inbox delete that walks a keyset in batches: q
// returns how many rows its batch selected, the batch's last value of the
// keyset, and how many rows it deleted; that value becomes args[next], the
// next batch's lower bound, so the dead index entries of earlier batches are
// not scanned again. A batch that meets a row locked by a writer is retried
// with qSkipLocked.
type keysetDelete struct {
	topic          string
	q, qSkipLocked string
	args           []any
	next           int
}

// deleteLoop runs the batches of d (T is the type of its keyset's value)
// until one finds fewer than BatchSize rows, and returns how many rows it
// deleted.
func deleteLoop[T any](ctx context.Context, p *pass, d keysetDelete) (int64, error) {
	c := p.c
	var total int64
	for {
		var found, gone int64
		var last T
		err := p.batch(ctx, func() error {
			del := func(q string) error {
				return deleteTx(ctx, p.conn, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, q, d.args...).Scan(&found, &last, &gone)
				})
			}
			err := del(d.q)
			if pgerr.IsLockTimeout(err) {
				c.cfg.Logger.InfoContext(ctx, "cleanup: a key is locked by a writer, retrying the batch without it", "topic", d.topic)
				err = del(d.qSkipLocked)
			}
			return err
		})
		if err != nil {
			return total, err
		}
		total += gone
		p.rep.Deleted += gone
		if found < int64(c.cfg.BatchSize) {
			return total, nil
		}
		d.args[d.next] = last
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
}

// deleteTx runs f in a transaction that commits without waiting for its WAL
// to reach disk: a delete lost in a crash is harmless (the rows are deleted
// again by the next pass), and the cleaner's commits then cost concurrent
// writers nothing in flush waits.
func deleteTx(ctx context.Context, conn *pgxpool.Conn, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlBatchSettings); err != nil {
			return err
		}
		return f(tx)
	})
}

// batch renews the lease, then runs one delete transaction and times it.
func (p *pass) batch(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.renewLease(ctx); err != nil {
		return err
	}
	t0 := time.Now()
	err := f()
	d := time.Since(t0)
	p.rep.Batches++
	p.rep.MaxBatch = max(p.rep.MaxBatch, d)
	if p.c.hookBatch != nil {
		p.c.hookBatch()
	}
	return err
}

func (c *Cleaner) pause(ctx context.Context) error {
	if c.cfg.Pause <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(c.cfg.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
