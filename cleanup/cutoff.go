package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Cutoffs computes each topic's rules the way a pass of a cleaner with the
// same settings would: the log start offsets of the exact rule, and the time
// rule's window and cutoff from Kafka's retention.ms, segment.ms and
// cleanup.policy and cfg's Buffer, Window and Topics, measured back from
// now. It reads Kafka only: it touches no table and never takes or waits on
// the cleanup lease, so status and metrics can call it while a pass runs. A
// cleaner's own settings: Config.CutoffsConfig.
//
// Every topic gets a TopicReport: LogStarts when Kafka gives them, Window and
// Cutoff when Kafka's config (or a forced window) gives one, Skipped with the
// Reason when neither. The deletion fields (Deleted, Oldest, Margin...) are
// left zero.
func Cutoffs(ctx context.Context, cfg CutoffsConfig, topics []string, now time.Time) ([]TopicReport, error) {
	if err := errors.Join(cfg.problems()...); err != nil {
		return nil, fmt.Errorf("cleanup: Cutoffs: %w", err)
	}
	c := &Cleaner{cfg: cfg.config().withDefaults()}
	kafka := describeTopics(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	positions := readLogStarts(ctx, c.cfg.Admin, c.cfg.KafkaTimeout, topics)
	out := make([]TopicReport, 0, len(topics))
	for _, t := range topics {
		out = append(out, c.plan(t, kafka[t], positions[t], now))
	}
	return out, nil
}
