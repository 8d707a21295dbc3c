package main

// Every use of pgbox's sarama consumer-group adapter (inbox/inboxsarama) is
// in this file.

import (
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
)

// newAdapter returns the consumer-group handler: BEGIN; inbox dedup; fn; COMMIT; mark.
func newAdapter(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, batch int, log *slog.Logger) (sarama.ConsumerGroupHandler, func() string, error) {
	h, err := inboxsarama.NewHandler(pool, ib, fn, inboxsarama.Config{BatchSize: batch, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	stats := func() string {
		s := h.Stats()
		return fmtStats(s.Processed, s.Duplicates, s.Failures, s.TransientErrors, s.DeadLettered)
	}
	return h, stats, nil
}

// permanent marks a handler error that no retry can fix (dead-letter at once).
func permanent(err error) error { return inboxsarama.Permanent(err) }
