package inspect

import "time"

// Snapshot is one read of pgbox's state; its JSON is what
// `relay status --json` prints.
type Snapshot struct {
	// Time is the database's clock when the snapshot was taken; every age is
	// measured from it, but the horizon's when Config.Horizon handed the
	// snapshot one read earlier (its ages are as of that read).
	Time time.Time `json:"time"`
	// ReadSeconds is how long the snapshot took to read.
	ReadSeconds float64 `json:"read_seconds"`

	// LaneCount is the relay's lane count (the lane table's, else Config.Lanes).
	LaneCount int `json:"lanes"`

	// Outbox sums the backlog.
	Outbox OutboxTotals `json:"outbox"`
	// Topics is the unpublished backlog per topic (and lane, when exact).
	Topics []TopicBacklog `json:"outbox_backlog"`
	// LaneAges is each lane's oldest unpublished, unparked row.
	LaneAges []LaneAge `json:"outbox_lane_oldest"`
	// ParkedTopics counts parked rows per topic.
	ParkedTopics []TopicCount `json:"outbox_parked_by_topic"`
	// Parked lists the newest parked rows (Config.ParkedList).
	Parked []ParkedRow `json:"parked_rows"`

	// Lanes is the lane table: which instance holds each lane.
	Lanes []Lane `json:"lanes_owned"`
	// Instances are the relay instances that announced themselves.
	Instances []Instance `json:"relay_instances"`

	// Inbox has one entry per consumer and source topic.
	Inbox []InboxTopic `json:"inbox"`
	// Cutoffs says where the inbox windows came from, or why there are none.
	Cutoffs string `json:"cutoffs"`

	// Dead counts the consumer adapter's dead letters per consumer and topic.
	Dead []DeadCount `json:"dead_letters"`
	// DeadEstimated is set when any of the Dead counts stopped at
	// Config.ExactLimit (DeadCount.Capped).
	DeadEstimated bool `json:"dead_letters_capped,omitempty"`

	// Horizon says who holds back VACUUM of pgbox's tables, and for how long.
	Horizon Horizon `json:"xmin_horizon"`
}

// OutboxTotals sums the outbox backlog.
type OutboxTotals struct {
	// Unpublished counts unpublished, unparked rows.
	Unpublished int64 `json:"unpublished"`
	// Estimated is set when Unpublished and the per-topic counts are
	// planner estimates (more than Config.ExactLimit rows).
	Estimated bool `json:"estimated"`
	// Parked counts parked rows (at most Config.ExactLimit: ParkedCapped).
	Parked       int64 `json:"parked"`
	ParkedCapped bool  `json:"parked_capped,omitempty"`
	// OldestAge is the age in seconds of the oldest unpublished, unparked
	// row; nil when there is none. Always exact.
	OldestAge *float64 `json:"oldest_unpublished_age_seconds"`
}

// TopicBacklog is one topic's unpublished, unparked rows.
type TopicBacklog struct {
	Topic string `json:"topic"`
	// Lane is the lane of these rows, or -1 when the counts are estimates
	// (estimates are per topic only).
	Lane        int   `json:"lane"`
	Unpublished int64 `json:"unpublished"`
	Estimated   bool  `json:"estimated"`
}

// LaneAge is one lane's oldest unpublished, unparked row.
type LaneAge struct {
	Lane int `json:"lane"`
	// OldestAge is in seconds; nil when the lane has no unpublished row.
	OldestAge *float64 `json:"oldest_unpublished_age_seconds"`
}

// TopicCount counts rows of one topic.
type TopicCount struct {
	Topic string `json:"topic"`
	Count int64  `json:"count"`
}

// ParkedRow is one parked outbox row.
type ParkedRow struct {
	ID        int64     `json:"id"`
	EventID   string    `json:"event_id"`
	Topic     string    `json:"topic"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	ParkedAt  time.Time `json:"parked_at"`
	// Held counts the later rows of its topic and key it holds back (see
	// ParkedMessage.Held); a lower bound when HeldCapped (the count read
	// Config.HeldScan later rows of the row's slot and stopped).
	Held       int64 `json:"held"`
	HeldCapped bool  `json:"held_capped,omitempty"`
}

// Lane is one row of the relay's lane table.
type Lane struct {
	Lane  int    `json:"lane"`
	Lanes int    `json:"lanes"`
	Owner string `json:"owner"`
	// Held is set while the owner's lease runs.
	Held      bool    `json:"held"`
	Epoch     int64   `json:"epoch"`
	ExpiresIn float64 `json:"expires_in_seconds"`
}

// Instance is one relay instance.
type Instance struct {
	Instance    string    `json:"instance"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
	// KafkaReady is false until the instance has reached Kafka since it
	// started; until then it takes no lanes.
	KafkaReady bool `json:"kafka_ready"`
	// KafkaDownSince is when the instance found Kafka unreachable (at
	// start-up, or every send of its passes failing); nil while Kafka
	// answers.
	KafkaDownSince *time.Time `json:"kafka_down_since,omitempty"`
	// Sleeping is set while the instance sleeps: it found no rows for a
	// while and polls every poll interval (a NOTIFY wakes it sooner)
	// instead of watching the table. A sleeping instance with a growing
	// backlog is not being woken (writers without outbox.Config.Notify, or
	// a pgbouncer that drops LISTEN).
	Sleeping bool `json:"sleeping"`
	// Dormant is set while the instance, a relay.Fleet's target idle for
	// FleetConfig.DormantAfter, has given up its lanes until rows come: it
	// is live and takes no lanes (its row reads sleeping and not
	// kafka_ready, which no other instance ever is).
	Dormant bool `json:"dormant"`
}

// DormantOnly reports whether every live instance is dormant and at least
// one is: the lanes are then unowned because nothing is waiting, and the
// first row wakes an instance.
func (s *Snapshot) DormantOnly() bool {
	n := 0
	for _, i := range s.Instances {
		switch {
		case i.Live && !i.Dormant:
			return false
		case i.Live:
			n++
		}
	}
	return n > 0
}

// InboxTopic is one consumer's keys of one source topic, and their oldest
// against the topic's cleanup cutoff.
type InboxTopic struct {
	Consumer string `json:"consumer"`
	Topic    string `json:"topic"`
	// Keys counts the keys; a planner estimate when Estimated.
	Keys      int64 `json:"keys"`
	Estimated bool  `json:"keys_estimated"`
	// Oldest is GREATEST(received_at, record_at) of the oldest key, the
	// time cleanup measures from; OldestAge is Snapshot.Time − Oldest in
	// seconds. Always exact.
	Oldest    time.Time `json:"oldest_key"`
	OldestAge float64   `json:"oldest_key_age_seconds"`
	// Window is how long cleanup keeps the topic's keys, in seconds; nil when
	// unknown or never pruned (Note says which).
	Window *float64 `json:"window_seconds,omitempty"`
	// Cutoff is Snapshot.Time − Window: keys older are due for deletion.
	Cutoff *time.Time `json:"cutoff,omitempty"`
	// Margin is Window − OldestAge in seconds; negative: keys past the
	// cutoff remain (cleanup not running?).
	Margin *float64 `json:"margin_seconds,omitempty"`
	Note   string   `json:"note,omitempty"`
}

// DeadCount counts one consumer's dead letters of one topic.
type DeadCount struct {
	Consumer string `json:"consumer"`
	Topic    string `json:"topic"`
	// Count is exact up to Config.ExactLimit; past it, Count is the limit
	// and Capped is set (a lower bound).
	Count  int64 `json:"count"`
	Capped bool  `json:"capped,omitempty"`
}

func seconds(d time.Duration) *float64 { s := d.Seconds(); return &s }
