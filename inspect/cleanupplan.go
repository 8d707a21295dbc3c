package inspect

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

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

// PartitionWait is one partition's inbox keys of known position against
// the exact cleanup rule: a key may go once the partition's log start
// offset has passed its offset and it is older than the buffer.
type PartitionWait struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// LogStart is the partition's log start offset, as Kafka gave it.
	LogStart int64 `json:"log_start"`
	// Behind counts keys below the log start (at most the limit: Capped):
	// they go at a pass once older than the buffer.
	Behind int64 `json:"behind"`
	// OldestBehind is the oldest of them (GREATEST(received_at,
	// record_at)); nil when none is behind.
	OldestBehind *time.Time `json:"oldest_behind,omitempty"`
	// Waiting counts keys at or past the log start (at most the limit:
	// Capped): they wait for Kafka to delete the segment holding them.
	Waiting int64 `json:"waiting"`
	// NextOffset is the lowest offset waiting: the next key the exact rule
	// lets go once the log start passes it; nil when none waits.
	NextOffset *int64 `json:"next_offset,omitempty"`
	Capped     bool   `json:"capped,omitempty"`
}

// sqlPartitionWait reads one partition's keys of known position against
// its log start ($1 topic, $2 partition, $3 log start), each count bounded
// by $4, along pgbox_inbox_position_idx (topic, partition, offset).
const sqlPartitionWait = `SELECT
	(SELECT count(*) FROM (SELECT 1 FROM pgbox_inbox WHERE topic = $1 AND partition = $2 AND "offset" < $3
		AND position_at >= received_at LIMIT $4) s),
	(SELECT min(t) FROM (SELECT GREATEST(received_at, record_at) AS t FROM pgbox_inbox WHERE topic = $1 AND partition = $2 AND "offset" < $3
		AND position_at >= received_at LIMIT $4) s),
	(SELECT count(*) FROM (SELECT 1 FROM pgbox_inbox WHERE topic = $1 AND partition = $2 AND "offset" >= $3
		AND position_at >= received_at LIMIT $4) s),
	(SELECT "offset" FROM pgbox_inbox WHERE topic = $1 AND partition = $2 AND "offset" >= $3
		AND position_at >= received_at ORDER BY "offset" LIMIT 1)`

// ExactWaits reads, for every partition Kafka gave a log start offset for
// in reps (from CleanupPlan), how many keys the exact rule lets go and how
// many wait on the log start; partitions without keys are left out. Each
// count stops at limit (zero: ExactLimitDefault).
func ExactWaits(ctx context.Context, db Querier, reps []cleanup.TopicReport, limit int) ([]PartitionWait, error) {
	limit = cmp.Or(limit, ExactLimitDefault)
	var out []PartitionWait
	for _, tr := range reps {
		for _, p := range slices.Sorted(maps.Keys(tr.LogStarts)) {
			w := PartitionWait{Topic: tr.Topic, Partition: p, LogStart: tr.LogStarts[p]}
			err := db.QueryRow(ctx, sqlPartitionWait, tr.Topic, p, w.LogStart, limit).Scan(&w.Behind, &w.OldestBehind, &w.Waiting, &w.NextOffset)
			if err != nil {
				return nil, fmt.Errorf("inspect: read the keys of %s partition %d against its log start: %w", tr.Topic, p, schemaHint(err))
			}
			if w.Behind == 0 && w.Waiting == 0 {
				continue
			}
			w.Capped = w.Behind >= int64(limit) || w.Waiting >= int64(limit)
			out = append(out, w)
		}
	}
	return out, nil
}
