package inspect

import (
	"context"
	"slices"

	"github.com/pgbox/pgbox/cleanup"
)

// CleanupPlan returns the cleanup rule of every topic with inbox keys in
// snap: Kafka's retention.ms, segment.ms and cleanup.policy, the window and
// cutoff a pass would use now, or the reason the topic is never pruned
// (cleanup.Cutoffs with cfg; no table read, no lease taken).
func CleanupPlan(ctx context.Context, snap *Snapshot, cfg cleanup.CutoffsConfig) ([]cleanup.TopicReport, error) {
	var topics []string
	for _, in := range snap.Inbox {
		if !slices.Contains(topics, in.Topic) {
			topics = append(topics, in.Topic)
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	return cleanup.Cutoffs(ctx, cfg, topics, snap.Time)
}
