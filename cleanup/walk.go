package cleanup

import (
	"math"
	"time"
)

// Where a pass's index walks start (issue 32). Each walk of a pass (the
// exact rule's per partition, the time rule's and the oldest-key probe per
// topic) would start at the first entry of its index range, and the keys
// earlier passes deleted sit right there: once VACUUM has removed them that
// costs nothing, but a held snapshot (pg_dump, a long report, an idle
// transaction, a replica's hot_standby_feedback) keeps every deleted key's
// index entry and heap tuple for as long as it lasts, and each walk would
// visit all of them again, pass after pass. So the Cleaner remembers, per
// walk, where the last one left off, and the next starts there.
//
// A remembered position only narrows what a walk reads; every key a batch
// deletes is re-checked against the rule with this pass's log start and
// cutoff, so a wrong position can keep a key longer, never delete one too
// early. Positions live in the Cleaner's memory: a new process (or another
// cleaner taking the lease) starts from the first entry once.
//
// What a position may miss is a key written behind it after the walk went
// past: a copy Kafka delivered before its log start moved, committed after
// the pass (the exact rule), or a transaction open for longer than the
// window (the time rule). Such keys are pruned by the next walk from the
// first entry, which each walk makes at least every fullWalkEvery, and at
// once when Kafka's log start goes back or the topic's id changes (a
// recreated topic).

// fullWalkEvery is how long a remembered position is trusted: a walk starts
// from the first entry of its range at least this often.
const fullWalkEvery = 24 * time.Hour

// walkKey names one walk: a partition's exact-rule walk, or a topic's
// time-rule walk (timeWalk) or oldest-key probe (oldestWalk).
type walkKey struct {
	topic string
	part  int32
}

const (
	timeWalk   int32 = -1
	oldestWalk int32 = -2
)

// walkMark is where a walk may start next time.
type walkMark struct {
	topicID string
	fullAt  time.Time // when this walk last started from the first entry

	// exact rule: every key of the partition below from was deleted or is
	// one the rule cannot take (position unknown), as of the log start the
	// walk went to.
	from, logStart int64

	// time rule: every key of unknown position (every key when all) older
	// than after was deleted.
	after time.Time
	all   bool
	// oldest-key probe: no key was older than oldest.
	oldest time.Time
}

// recall returns the mark of walk k if it may be used by a pass at now for
// the topic with id topicID; ok false means walk from the first entry.
func (c *Cleaner) recall(k walkKey, topicID string, now time.Time) (walkMark, bool) {
	c.mu.Lock()
	m, ok := c.walks[k]
	c.mu.Unlock()
	if !ok || m.topicID != topicID || now.Before(m.fullAt) || now.Sub(m.fullAt) >= fullWalkEvery {
		return walkMark{fullAt: now, topicID: topicID}, false
	}
	return m, true
}

func (c *Cleaner) remember(k walkKey, m walkMark) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.walks == nil {
		c.walks = map[walkKey]walkMark{}
	}
	c.walks[k] = m
}

// exactFrom is where the exact rule's walk of one partition starts, with log
// start start: where the last walk left off, unless the log start went back
// since (a recreated topic, a restored cluster).
func (c *Cleaner) exactFrom(topic, topicID string, part int32, start int64, now time.Time) (walkMark, int64) {
	m, ok := c.recall(walkKey{topic, part}, topicID, now)
	if !ok || start < m.logStart {
		return walkMark{fullAt: now, topicID: topicID}, math.MinInt64
	}
	return m, m.from
}
