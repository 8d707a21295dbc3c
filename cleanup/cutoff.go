package cleanup

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Cutoffs computes each topic's rules the way a pass would: the log start
// offsets of the exact rule, and the time rule's window and cutoff from
// Kafka's retention.ms, segment.ms and cleanup.policy and cfg's Buffer,
// Window and Topics, measured back from now. It reads Kafka only: it touches
// no table and never takes or waits on the cleanup lease, so status and
// metrics can call it while a pass runs. cfg.Pool is not used and may be nil;
// cfg.Admin is required.
//
// Every topic gets a TopicReport: LogStarts when Kafka gives them, Window and
// Cutoff when Kafka's config (or a forced window) gives one, Skipped with the
// Reason when neither. The deletion fields
// (Deleted, Oldest, Margin...) are left zero.
func Cutoffs(ctx context.Context, cfg Config, topics []string, now time.Time) ([]TopicReport, error) {
	if err := cfg.validateCutoffs(); err != nil {
		return nil, err
	}
	c := &Cleaner{cfg: cfg.withDefaults()}
	kafka := describeTopics(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	positions := readLogStarts(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	out := make([]TopicReport, 0, len(topics))
	for _, t := range topics {
		out = append(out, c.plan(t, kafka[t], positions[t], now))
	}
	return out, nil
}

// validateCutoffs is validate without the Pool requirement.
func (c Config) validateCutoffs() error {
	if c.Admin == nil {
		return errors.New("cleanup: Cutoffs: missing Admin (wrap your Kafka admin client, e.g. cleanupsarama.New(admin))")
	}
	if c.Pool == nil {
		// Only validate's nil check sees this placeholder; Cutoffs never uses it.
		c.Pool = new(pgxpool.Pool)
	}
	return c.validate()
}
