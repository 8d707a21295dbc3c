package main

// Every use of pgbox's consumer adapters (inbox/inboxsarama and
// inbox/inboxfranz) is in this file. A payments member runs on one client
// or the other (--client); the harness puts one of each in the same group,
// as a service does while it moves from sarama to franz-go.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
)

// groupMember is what a payments member needs of its consumer, whichever client.
type groupMember struct {
	group, member string
	brokers       []string
	topics        []string
	batch         int
}

// runSarama consumes with the sarama adapter until ctx ends.
func (m groupMember) runSarama(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc) (func() string, error) {
	h, err := inboxsarama.NewHandler(pool, ib, fn, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: m.batch, Logger: log}})
	if err != nil {
		return nil, err
	}
	stats := func() string { return fmtStats(h.Stats()) }
	cg, err := sarama.NewConsumerGroup(m.brokers, m.group, consumerConfig(m.member))
	if err != nil {
		return nil, fmt.Errorf("payments: consumer group %s: %w", m.group, err)
	}
	defer cg.Close()
	go logStats(ctx, log, stats)
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, m.topics, h); err != nil && ctx.Err() == nil {
			log.Warn("consumer group session ended", "err", err)
			_ = sleep(ctx, 200*time.Millisecond)
		}
	}
	return stats, nil
}

// runFranz consumes with the franz-go adapter until ctx ends. Its group
// settings match consumerConfig's, and its balancer is sarama's default
// (range, eager), so both clients share the group.
func (m groupMember) runFranz(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc) (func() string, error) {
	var mu sync.Mutex
	var total inbox.ConsumerStats
	var cur *inboxfranz.Consumer
	stats := func() string {
		mu.Lock()
		defer mu.Unlock()
		if cur != nil {
			return fmtStats(add(total, cur.Stats()))
		}
		return fmtStats(total)
	}
	go logStats(ctx, log, stats)
	for ctx.Err() == nil {
		c, err := inboxfranz.NewConsumer(pool, ib, fn, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: m.batch, Logger: log}, CommitInterval: 200 * time.Millisecond},
			kgo.SeedBrokers(m.brokers...), kgo.ConsumerGroup(m.group), kgo.ConsumeTopics(m.topics...),
			kgo.DisableAutoCommit(), kgo.Balancers(kgo.RangeBalancer()),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.ClientID("payments-"+m.member),
			kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(time.Second),
			kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
			kgo.DialTimeout(2*time.Second))
		if err != nil {
			return nil, err
		}
		mu.Lock()
		cur = c
		mu.Unlock()
		err = c.Run(ctx)
		c.Close()
		mu.Lock()
		total, cur = add(total, c.Stats()), nil
		mu.Unlock()
		if err != nil && ctx.Err() == nil {
			log.Warn("consumer ended", "err", err)
			_ = sleep(ctx, 200*time.Millisecond)
		}
	}
	return stats, nil
}

// run consumes with client ("sarama" or "franz") until ctx ends and returns
// the final stats.
func (m groupMember) run(ctx context.Context, client string, log *slog.Logger, pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc) (string, error) {
	var stats func() string
	var err error
	switch client {
	case "sarama":
		stats, err = m.runSarama(ctx, log, pool, ib, fn)
	case "franz":
		stats, err = m.runFranz(ctx, log, pool, ib, fn)
	default:
		return "", fmt.Errorf("payments: --client=%q: want sarama or franz", client)
	}
	if err != nil {
		return "", err
	}
	return stats(), nil
}

func add(a, b inbox.ConsumerStats) inbox.ConsumerStats {
	a.Processed += b.Processed
	a.Duplicates += b.Duplicates
	a.Failures += b.Failures
	a.TransientErrors += b.TransientErrors
	a.DeadLettered += b.DeadLettered
	return a
}

// permanent marks a handler error that no retry can fix (dead-letter at once).
func permanent(err error) error { return inbox.Permanent(err) }

func splitList(s string) []string { return strings.Split(s, ",") }
