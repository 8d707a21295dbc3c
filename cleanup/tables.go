package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/pgerr"
)

// Forever, as a Tables retention, keeps those rows: they are never pruned.
const Forever time.Duration = -1

// Defaults for Tables fields left zero.
const (
	// ParkedDefault keeps parked outbox rows: they are events that were never
	// published, and only an operator should decide to drop them.
	ParkedDefault = Forever
	// DeadLettersDefault is how long pgbox_consumer_dead rows are kept.
	DeadLettersDefault = 30 * 24 * time.Hour
	// AttemptsDefault is how long a pgbox_consumer_attempts row nobody
	// updates is kept.
	AttemptsDefault = 7 * 24 * time.Hour
)

// Tables sets how long the rows the relay and the consumer adapter leave
// behind are kept. Each retention is a positive duration, or Forever.
// Published outbox rows need none: the relay deletes them as it publishes.
type Tables struct {
	// Parked is how long a parked outbox row (one the relay gave up
	// publishing, parked_at set) is kept, from parked_at. Defaults to
	// ParkedDefault (Forever).
	Parked time.Duration

	// DeadLetters is how long a pgbox_consumer_dead row is kept, from
	// dead_at. Those rows also stop a redelivered record without a usable
	// key from being dead-lettered twice, so a row is never deleted before
	// its topic's inbox keys would be (and never while that topic is
	// skipped). Defaults to DeadLettersDefault (30 days).
	DeadLetters time.Duration

	// Attempts is how long a pgbox_consumer_attempts row is kept after its
	// last update. A row nobody updates belongs to a record no consumer
	// retries any more; deleting a live one only resets its attempt count.
	// Defaults to AttemptsDefault (7 days).
	Attempts time.Duration
}

func (t Tables) withDefaults() Tables {
	if t.Parked == 0 {
		t.Parked = ParkedDefault
	}
	if t.DeadLetters == 0 {
		t.DeadLetters = DeadLettersDefault
	}
	if t.Attempts == 0 {
		t.Attempts = AttemptsDefault
	}
	return t
}

func (t Tables) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Config.Tables.Parked", t.Parked}, {"Config.Tables.DeadLetters", t.DeadLetters}, {"Config.Tables.Attempts", t.Attempts}} {
		if f.v < 0 && f.v != Forever {
			errs = append(errs, fmt.Errorf("%s %v is negative (use a positive duration, cleanup.Forever, or zero for the default)", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// tableJob is one kind of row pruned by age, in batches.
type tableJob struct {
	name   string
	cutoff time.Time
	del    string // args: cutoff, limit[, topic]
	delSL  string // del, skipping locked rows
	count  string // args: cutoff[, topic]
	topic  string // "" unless the job is per topic
}

// pruneTables prunes parked outbox rows, dead letters and stale attempts.
func (p *pass) pruneTables(ctx context.Context) error {
	rep, cfg := p.rep, p.c.cfg.Tables
	if cfg.Parked != Forever {
		tr := TableReport{Name: "pgbox_outbox (parked)", Keep: cfg.Parked, Cutoff: rep.Now.Add(-cfg.Parked)}
		err := p.pruneJob(ctx, &tr, tableJob{
			name: tr.Name, cutoff: tr.Cutoff,
			del: sqlDeleteParked, delSL: sqlDeleteParkedSkipLocked, count: sqlCountParked,
		})
		rep.Tables = append(rep.Tables, tr)
		if err != nil {
			return err
		}
	}

	if cfg.DeadLetters != Forever {
		// Per source topic: the earlier of the configured cutoff and the
		// topic's time-rule cutoff; topics without a time window (skipped,
		// or pruned by the exact rule alone) keep their rows.
		tr := TableReport{Name: "pgbox_consumer_dead", Keep: cfg.DeadLetters, Cutoff: rep.Now.Add(-cfg.DeadLetters)}
		var err error
		for _, t := range rep.Topics {
			if !t.Timed {
				continue
			}
			cutoff := tr.Cutoff
			if t.Cutoff.Before(cutoff) {
				cutoff = t.Cutoff
			}
			if err = p.pruneJob(ctx, &tr, tableJob{
				name: tr.Name, cutoff: cutoff, topic: t.Topic,
				del: sqlDeleteDead, delSL: sqlDeleteDeadSkipLocked, count: sqlCountDead,
			}); err != nil {
				break
			}
		}
		rep.Tables = append(rep.Tables, tr)
		if err != nil {
			return err
		}
	}

	if cfg.Attempts != Forever {
		tr := TableReport{Name: "pgbox_consumer_attempts", Keep: cfg.Attempts, Cutoff: rep.Now.Add(-cfg.Attempts)}
		err := p.pruneJob(ctx, &tr, tableJob{
			name: tr.Name, cutoff: tr.Cutoff,
			del: sqlDeleteAttempts, delSL: sqlDeleteAttemptsSkipLocked, count: sqlCountAttempts,
		})
		rep.Tables = append(rep.Tables, tr)
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *pass) pruneJob(ctx context.Context, tr *TableReport, job tableJob) error {
	c := p.c
	args := []any{job.cutoff}
	if job.topic != "" {
		args = append(args, job.topic)
	}
	what := job.name
	if job.topic != "" {
		what = fmt.Sprintf("%s of topic %q", job.name, job.topic)
	}
	if c.cfg.DryRun {
		var n int64
		if err := p.conn.QueryRow(ctx, job.count, args...).Scan(&n); err != nil {
			return fmt.Errorf("count expired rows of %s: %w", what, err)
		}
		tr.WouldDelete += n
		return nil
	}
	args = append(args, c.cfg.BatchSize)
	for {
		var found, gone int64
		err := p.batch(ctx, func() error {
			del := func(q string) error {
				return deleteTx(ctx, p.conn, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, q, args...).Scan(&found, &gone)
				})
			}
			err := del(job.del)
			if pgerr.IsLockTimeout(err) {
				err = del(job.delSL)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("delete expired rows of %s: %w", what, err)
		}
		tr.Deleted += gone
		p.rep.Deleted += gone
		if found < int64(c.cfg.BatchSize) {
			return nil
		}
		if err := c.pause(ctx); err != nil {
			return err
		}
	}
}
