package cleanup

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Cutoffs computes each topic's window and cutoff the way a pass would, from
// Kafka's retention.ms, segment.ms and cleanup.policy and cfg's Buffer,
// Window and Topics, measured back from now. It reads Kafka only: it touches
// no table and never takes or waits on the cleanup lease, so status and
// metrics can call it while a pass runs. cfg.Pool is not used and may be nil;
// cfg.Admin is required.
//
// Every topic gets a TopicReport: Window and Cutoff when Kafka's config (or a
// forced window) gives one, else Skipped with the Reason. The deletion fields
// (Deleted, Oldest, Margin...) are left zero.
func Cutoffs(ctx context.Context, cfg Config, topics []string, now time.Time) ([]TopicReport, error) {
	if err := cfg.validateCutoffs(); err != nil {
		return nil, err
	}
	c := &Cleaner{cfg: cfg.withDefaults()}
	kafka := describeTopics(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	out := make([]TopicReport, 0, len(topics))
	for _, t := range topics {
		out = append(out, c.plan(t, kafka[t], now))
	}
	return out, nil
}

// validateCutoffs is validate without the Pool requirement.
func (c Config) validateCutoffs() error {
	if c.Admin == nil {
		return errors.New("cleanup: Cutoffs: missing Admin (pass a sarama.ClusterAdmin, e.g. from sarama.NewClusterAdmin(brokers, cfg))")
	}
	if c.Pool == nil {
		// Only validate's nil check sees this placeholder; Cutoffs never uses it.
		c.Pool = new(pgxpool.Pool)
	}
	return c.validate()
}
