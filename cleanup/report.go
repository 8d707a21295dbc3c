package cleanup

import "time"

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

	lease *lease // the pass's hold on the cleanup lease; nil when Locked
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
type TopicReport struct {
	Topic string

	// RetentionMs, SegmentMs and CleanupPolicy are what Kafka reported; zero
	// when it reported nothing usable.
	RetentionMs   int64
	SegmentMs     int64
	CleanupPolicy string

	// Reason says why Kafka's config gives no window for this topic; empty
	// when it does. With a forced Window the topic is still pruned.
	Reason Reason
	// Err details Reason.
	Err error

	// Skipped is set when the topic's keys were not pruned (a Reason and no
	// forced window).
	Skipped bool
	// Forced is set when a forced window (Config.Window, Topic.Window) decided
	// the cutoff.
	Forced bool

	// Window is how long keys are kept: retention.ms + segment.ms + buffer, or
	// the forced window. Zero when skipped.
	Window time.Duration
	// Cutoff is Now − Window: keys whose GREATEST(received_at, record_at) is
	// strictly before Cutoff are deleted; a key exactly at Cutoff is kept.
	Cutoff time.Time

	// Deleted is how many keys the pass deleted.
	Deleted int64
	// WouldDelete is how many keys are past the cutoff (dry runs only).
	WouldDelete int64

	// Oldest is GREATEST(received_at, record_at) of the oldest key left after
	// the pass; zero when the topic has no keys left.
	Oldest time.Time
	// OldestAge is Now − Oldest.
	OldestAge time.Duration
	// Margin is Window − OldestAge: how far the oldest remaining key is from
	// being deleted. Negative means keys older than the cutoff remain (dry
	// run, rows locked by a writer, an interrupted pass). Zero when skipped.
	Margin time.Duration
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
	// TopicsSkipped counts topic-passes that pruned nothing for a Reason.
	TopicsSkipped int64
	// LastPass is when the last pass that ran started; LastDuration its length.
	LastPass     time.Time
	LastDuration time.Duration
	// MaxBatch is the longest delete transaction seen.
	MaxBatch time.Duration
	// Topics has per-topic counters and the last pass's view of each topic.
	Topics map[string]TopicStats
}

// TopicStats are one topic's counters.
type TopicStats struct {
	// Deleted counts keys deleted over the cleaner's lifetime.
	Deleted int64
	// Reason is why the last pass skipped the topic; empty if it was pruned.
	Reason Reason
	// Window, OldestAge and Margin are from the last pass (see TopicReport).
	Window    time.Duration
	OldestAge time.Duration
	Margin    time.Duration
}
