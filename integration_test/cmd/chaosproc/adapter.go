package main

// Every use of pgbox's sarama consumer-group adapter is in this file, so the
// adapter's move to its own package (inbox/inboxsarama) changes only these
// lines.

import (
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
)

// newAdapter returns the consumer-group handler: BEGIN; inbox dedup; fn; COMMIT; mark.
func newAdapter(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, batch int, log *slog.Logger) (sarama.ConsumerGroupHandler, func() string, error) {
	h, err := inbox.NewConsumerGroupHandler(pool, ib, fn, inbox.HandlerOptions{BatchSize: batch, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	stats := func() string {
		s := h.Stats()
		return fmtStats(s.Processed, s.Duplicates, s.Failures, s.TransientErrors, s.DeadLettered)
	}
	return h, stats, nil
}
