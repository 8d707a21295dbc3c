package cleanup

import (
	"context"
	"errors"
	"time"
)

// Report describes one pass.
type Report struct {
	// Start is when the pass began (wall clock of this process).
	Start time.Time
	// Duration is how long the pass took.
	Duration time.Duration
	// Now is the clock reading every cutoff of the pass was computed from
	// (Config.Now, or the database's now()).
	Now time.Time
	// DryRun is set when the pass only counted.
	DryRun bool
	// Locked is set when another cleaner held the lease (pgbox_cleanup_lease):
	// this pass did nothing.
	Locked bool
	// Topics has one entry per topic that has keys in the inbox, by name.
	Topics []TopicReport
	// Tables has one entry per other pgbox table pruned (outbox, dead letters).
	Tables []TableReport
	// Deleted is the total number of rows deleted by the pass.
	Deleted int64
	// Batches is the number of delete transactions the pass ran.
	Batches int
	// MaxBatch is the longest delete transaction of the pass: concurrent
	// writers never wait on the cleaner for longer than this.
	MaxBatch time.Duration
}

// Skipped returns the topics whose keys the pass did not prune.
func (r Report) Skipped() []TopicReport {
	var out []TopicReport
	for _, t := range r.Topics {
		if t.Skipped {
			out = append(out, t)
		}
	}
	return out
}

// Topic returns the report of one topic, and whether the pass saw it.
func (r Report) Topic(name string) (TopicReport, bool) {
	for _, t := range r.Topics {
		if t.Topic == name {
			return t, true
		}
	}
	return TopicReport{}, false
}

// TopicReport describes what a pass did with one source topic's inbox keys.
//
// Two rules delete keys. The exact rule: a key goes once the log start offset
// of the partition of its last-seen copy (LogStarts) has passed that copy's
// offset and the key is older than the buffer (ExactCutoff); it needs no
// clock or config and is right for every cleanup.policy. The time rule: a
// key goes once older than Window (retention.ms + segment.ms + buffer, or a
// forced window); it applies only to keys whose position is unknown (written
// before migration 00070 or by an older pgbox, or seen on two partitions),
// and only where the topic's config gives a time window (cleanup.policy
// delete, finite retention.ms), or to every key under a forced window.
type TopicReport struct {
	Topic string

	// RetentionMs, SegmentMs and CleanupPolicy are what Kafka reported; zero
	// when it reported nothing usable.
	RetentionMs   int64
	SegmentMs     int64
	CleanupPolicy string

	// TopicID is the topic's Kafka id, when the broker gives it.
	TopicID string
	// LogStarts holds the log start offset of each partition Kafka answered
	// for (ListOffsets, earliest); nil when it answered for none.
	LogStarts map[int32]int64
	// OffsetsErr says why the exact rule could not run for the topic, or for
	// some of its partitions (their keys are kept); nil when it ran for all.
	OffsetsErr error
	// Exact is set when the exact rule ran (Kafka gave the log start offset
	// of at least one partition).
	Exact bool
	// ExactCutoff is Now − buffer: the exact rule deletes only keys whose
	// GREATEST(received_at, record_at) is strictly before it.
	ExactCutoff time.Time

	// Reason says why Kafka's config gives no time window for this topic;
	// empty when it does. With a forced Window the time rule still runs.
	Reason Reason
	// Err details Reason.
	Err error

	// Skipped is set when neither rule could run: no log start offsets, no
	// time window, no forced window.
	Skipped bool
	// Timed is set when the time rule ran (Window and Cutoff are set).
	Timed bool
	// Forced is set when a forced window (Config.Window, Topic.Window) decided
	// the time rule's cutoff.
	Forced bool

	// Window is the time rule's window: retention.ms + segment.ms + buffer,
	// or the forced window. Zero when the time rule did not run.
	Window time.Duration
	// Cutoff is Now − Window: keys the time rule applies to whose
	// GREATEST(received_at, record_at) is strictly before Cutoff are
	// deleted; a key exactly at Cutoff is kept.
	Cutoff time.Time

	// Deleted is how many keys the pass deleted: ExactDeleted + TimeDeleted.
	Deleted int64
	// ExactDeleted and TimeDeleted are how many keys each rule deleted.
	ExactDeleted, TimeDeleted int64
	// WouldDelete is how many keys a pass would delete (dry runs only):
	// ExactWouldDelete + TimeWouldDelete.
	WouldDelete int64
	// ExactWouldDelete and TimeWouldDelete split WouldDelete by rule.
	ExactWouldDelete, TimeWouldDelete int64

	// Oldest is GREATEST(received_at, record_at) of the oldest key left after
	// the pass; zero when the topic has no keys left.
	Oldest time.Time
	// OldestAge is Now − Oldest.
	OldestAge time.Duration
	// Margin is Window − OldestAge: how far the oldest remaining key is from
	// the time rule's cutoff. Negative means keys older than the cutoff
	// remain (keys of known position Kafka still holds, a dry run, rows
	// locked by a writer, an interrupted pass). Zero when the time rule did
	// not run.
	Margin time.Duration
}

// Note says in a few words which rules pruned the topic, or why neither
// could: what `relay cleanup` and `relay status` print beside it. A Kafka
// that cannot be reached is "not pruned this pass", never "never pruned".
func (t TopicReport) Note() string {
	var note string
	switch {
	case t.Skipped && t.Reason.Transient():
		note = "not pruned this pass: " + string(t.Reason)
	case t.Skipped:
		note = "never pruned: " + string(t.Reason)
	case t.Exact && t.Forced:
		note = "exact rule; forced window for the time rule (" + string(t.Reason) + ")"
	case t.Forced:
		note = "forced window for the time rule (" + string(t.Reason) + "); exact rule unavailable"
	case t.Exact && t.Timed:
		note = "exact rule; time rule for keys of unknown position"
	case t.Exact && t.Reason.Transient():
		note = "exact rule; no time rule this pass: " + string(t.Reason)
	case t.Exact:
		note = "exact rule only; never pruned by time: " + string(t.Reason)
	default:
		note = "time rule only; exact rule unavailable"
	}
	switch {
	case t.Err != nil && t.Reason.Transient():
		note += ": " + t.Err.Error()
	case t.OffsetsErr != nil:
		note += ": " + t.OffsetsErr.Error()
	}
	return note
}

// Transient reports whether the reason may pass by itself (Kafka
// unreachable, a topic not found or a config unreadable this time), as
// opposed to a topic config that keeps records forever.
func (r Reason) Transient() bool {
	switch r {
	case ReasonKafkaUnreachable, ReasonConfigUnreadable, ReasonTopicNotFound, ReasonPolicyMissing:
		return true
	}
	return false
}

// TableReport describes the pruning of one of the other pgbox tables.
type TableReport struct {
	// Name names the table and the rows pruned, e.g. "pgbox_outbox (published)".
	Name string
	// Keep is the configured retention of these rows.
	Keep time.Duration
	// Cutoff is Now − Keep: rows older than it are deleted.
	Cutoff time.Time
	// Deleted is how many rows the pass deleted.
	Deleted int64
	// WouldDelete is how many rows are past the cutoff (dry runs only).
	WouldDelete int64
}

// Stats are counters over the cleaner's lifetime.
type Stats struct {
	// Passes counts passes that ran (held the lease).
	Passes int64
	// PassesLocked counts passes skipped because another cleaner held the lease.
	PassesLocked int64
	// PassErrors counts passes that ended with an error (cancellation excluded).
	PassErrors int64
	// Deleted counts rows deleted, all tables together.
	Deleted int64
	// TopicsSkipped counts topic-passes that could run neither rule.
	TopicsSkipped int64
	// LastPass is when the last pass that ran started; LastDuration its length.
	LastPass     time.Time
	LastDuration time.Duration
	// MaxBatch is the longest delete transaction seen.
	MaxBatch time.Duration
	// Topics has per-topic counters and the last pass's view of each topic.
	Topics map[string]TopicStats
}

// Add counts one pass, its report rep and its error err (nil when it
// succeeded), as a Cleaner counts its own: a service that runs passes of
// several cleaners (one per schema) keeps their totals with it.
func (s *Stats) Add(rep Report, err error) {
	if rep.Locked {
		s.PassesLocked++
		return
	}
	s.Passes++
	if err != nil && !errors.Is(err, context.Canceled) {
		s.PassErrors++
	}
	s.Deleted += rep.Deleted
	s.LastPass, s.LastDuration = rep.Start, rep.Duration
	s.MaxBatch = max(s.MaxBatch, rep.MaxBatch)
	if s.Topics == nil {
		s.Topics = map[string]TopicStats{}
	}
	for _, t := range rep.Topics {
		ts := s.Topics[t.Topic]
		ts.Deleted += t.Deleted
		ts.ExactDeleted += t.ExactDeleted
		ts.TimeDeleted += t.TimeDeleted
		ts.Reason, ts.Skipped, ts.Last = "", t.Skipped, t
		if t.Skipped {
			s.TopicsSkipped++
			ts.Reason = t.Reason
		}
		ts.Window, ts.OldestAge, ts.Margin = t.Window, t.OldestAge, t.Margin
		s.Topics[t.Topic] = ts
	}
}

// TopicStats are one topic's counters.
type TopicStats struct {
	// Deleted counts keys deleted over the cleaner's lifetime.
	Deleted int64
	// Reason is why the last pass could run neither rule for the topic;
	// empty if it ran one.
	Reason Reason
	// Skipped is set when the last pass could run neither rule for the topic.
	Skipped bool
	// ExactDeleted and TimeDeleted split Deleted by rule.
	ExactDeleted, TimeDeleted int64
	// Last is the last pass's report of the topic: which rules ran, and why
	// not (what Cutoffs would give, with the deletion fields filled).
	Last TopicReport
	// Window, OldestAge and Margin are from the last pass (see TopicReport).
	Window    time.Duration
	OldestAge time.Duration
	Margin    time.Duration
}
