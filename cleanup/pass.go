package cleanup

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pass is one pass of RunOnce that got the lease: it owns the pooled
// connection every statement of the pass runs on, its lease (lease.go:
// renewed before each delete batch, released at the end) and the Report it
// fills.
type pass struct {
	c     *Cleaner
	conn  *pgxpool.Conn
	owner string // the lease row's owner while this pass holds it
	rep   *Report
}

// runPass takes a connection and the lease, and runs a pass; with the lease
// held elsewhere it sets rep.Locked and returns nil.
func (c *Cleaner) runPass(ctx context.Context, rep *Report) error {
	conn, err := c.cfg.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	owner, took, err := takeLease(ctx, conn)
	if err != nil {
		return err
	}
	if !took {
		rep.Locked = true
		c.cfg.Logger.InfoContext(ctx, "cleanup skipped: another cleaner holds the lease")
		return nil
	}
	p := &pass{c: c, conn: conn, owner: owner, rep: rep}
	defer p.releaseLease(ctx)
	if c.hookLocked != nil {
		c.hookLocked()
	}
	return p.run(ctx)
}

// run prunes every inbox topic, then the other tables.
func (p *pass) run(ctx context.Context) error {
	c, conn, rep := p.c, p.conn, p.rep
	if c.cfg.Now != nil {
		rep.Now = c.cfg.Now()
	} else if err := conn.QueryRow(ctx, sqlNow).Scan(&rep.Now); err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}

	topics, err := listTopics(ctx, conn, sqlTopics)
	if err != nil {
		return err
	}
	if c.cfg.Tables.DeadLetters != Forever {
		// Dead letters follow their topic's window, also once the topic's
		// inbox keys are gone.
		dead, err := listTopics(ctx, conn, sqlDeadTopics)
		if err != nil {
			return err
		}
		topics = slices.Compact(slices.Sorted(slices.Values(append(topics, dead...))))
	}
	// rep.Now was read before Kafka is: every key the exact rule may delete
	// is older than rep.Now − buffer, so it was written before the log start
	// offsets were read, and a topic deleted and recreated meanwhile can only
	// make them smaller (keys kept longer), never judge a newer key.
	kafka := describeTopics(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	positions := readLogStarts(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	if err := p.renewLease(ctx); err != nil { // Kafka may have taken a while
		return err
	}
	for _, name := range topics {
		tr := c.plan(name, kafka[name], positions[name], rep.Now)
		c.logPlan(ctx, tr)
		err := p.pruneTopic(ctx, &tr)
		rep.Topics = append(rep.Topics, tr)
		if err != nil {
			return err
		}
		if !tr.Skipped {
			c.cfg.Logger.DebugContext(ctx, "cleanup pruned topic", "topic", name, "deleted", tr.Deleted,
				"exact_deleted", tr.ExactDeleted, "time_deleted", tr.TimeDeleted, "would_delete", tr.WouldDelete,
				"window", tr.Window.String(), "forced", tr.Forced,
				"oldest_age", tr.OldestAge.String(), "margin", tr.Margin.String())
		}
	}

	if err := p.pruneTables(ctx); err != nil {
		return err
	}
	return nil
}

func listTopics(ctx context.Context, conn *pgxpool.Conn, query string) ([]string, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("list inbox topics: %w", err)
	}
	topics, err := pgxCollectStrings(rows)
	if err != nil {
		return nil, fmt.Errorf("list inbox topics: %w", err)
	}
	slices.Sort(topics)
	return topics, nil
}

var errNoRows = pgx.ErrNoRows

func pgxCollectStrings(rows pgx.Rows) ([]string, error) {
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
