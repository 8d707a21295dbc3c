package cleanup

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// logPlan logs a topic neither rule can prune, or one whose exact rule
// could not run: at INFO when its config keeps the records forever, at WARN
// when an operator should look (Kafka unreachable, a topic not found).
func (c *Cleaner) logPlan(ctx context.Context, tr TopicReport) {
	switch {
	case tr.Skipped:
		level := slog.LevelWarn
		if !tr.Reason.Transient() {
			level = slog.LevelInfo
		}
		c.cfg.Logger.Log(ctx, level, "cleanup skipped topic", "topic", tr.Topic, "reason", string(tr.Reason), "error", tr.Err)
	case tr.OffsetsErr != nil:
		c.cfg.Logger.WarnContext(ctx, "cleanup: no log start offsets, keys of known position kept", "topic", tr.Topic, "error", tr.OffsetsErr)
	case !tr.Timed:
		c.cfg.Logger.InfoContext(ctx, "cleanup: no time window, exact rule only", "topic", tr.Topic, "reason", string(tr.Reason))
	}
}

// plan turns what Kafka said about a topic into the rules that apply: the
// exact rule where Kafka gave log start offsets, the time rule with its
// window and cutoff where the config (or a forced window) gives one.
func (c *Cleaner) plan(name string, k kafkaTopic, pos topicPositions, now time.Time) TopicReport {
	buffer, forced := c.cfg.topic(name)
	tr := TopicReport{
		Topic:         name,
		RetentionMs:   k.retentionMs,
		SegmentMs:     k.segmentMs,
		CleanupPolicy: k.policy,
		TopicID:       pos.id,
		LogStarts:     pos.starts,
		OffsetsErr:    pos.err,
		Exact:         len(pos.starts) > 0,
		ExactCutoff:   now.Add(-buffer),
		Reason:        k.reason,
		Err:           k.err,
	}
	if k.reason == "" {
		w, ok := addNoOverflow(k.retention, k.segment, buffer)
		if !ok {
			// A window past what a Duration holds: pgbox cannot compute a
			// cutoff, so the time rule keeps the keys (Kafka keeps the
			// records for centuries anyway).
			tr.Reason = ReasonConfigUnreadable
			tr.Err = fmt.Errorf("topic %q: retention.ms %d + segment.ms %d + buffer %v overflows the cutoff arithmetic", name, k.retentionMs, k.segmentMs, buffer)
		} else {
			tr.Window = w
		}
	}
	switch {
	case tr.Reason == "":
		if forced > tr.Window {
			tr.Window, tr.Forced = forced, true
		}
	case forced > 0:
		tr.Window, tr.Forced = forced, true
	default:
		tr.Skipped = !tr.Exact
		return tr
	}
	tr.Timed = true
	tr.Cutoff = now.Add(-tr.Window)
	return tr
}

// addNoOverflow sums non-negative durations, reporting false on overflow.
func addNoOverflow(ds ...time.Duration) (time.Duration, bool) {
	var sum time.Duration
	for _, d := range ds {
		if d > time.Duration(1<<63-1)-sum {
			return 0, false
		}
		sum += d
	}
	return sum, true
}
