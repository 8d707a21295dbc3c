package relay

import (
	"context"
	"fmt"
)

// historySQL writes one sample of the outbox to pgbox_relay_history
// (migration 00110), which the console's overview charts over the last
// hour: per topic, the unpublished, unparked backlog (counted up to $1
// rows, so a sample stays cheap on a huge table; a capped
// count is a lower bound) and the rows this instance published of it since
// its previous sample ($2 topics, $3 counts). A row with topic ” marks
// the sample itself, so an idle outbox still shows as zero rather than as
// no data. Samples older than two hours are deleted in the same statement,
// so the table stays a few thousand rows.
const historySQL = `WITH b AS (
	SELECT topic, count(*)::bigint AS n
	FROM (SELECT topic FROM pgbox_outbox WHERE parked_at IS NULL LIMIT $1) s GROUP BY topic
), p AS (
	SELECT topic, n FROM unnest($2::text[], $3::bigint[]) AS p(topic, n)
), ins AS (
	INSERT INTO pgbox_relay_history (topic, backlog, published)
	SELECT '', 0, 0
	UNION ALL
	SELECT coalesce(b.topic, p.topic), coalesce(b.n, 0), coalesce(p.n, 0) FROM b FULL JOIN p ON b.topic = p.topic
), old AS (
	DELETE FROM pgbox_relay_history WHERE at < now() - interval '2 hours'
)
SELECT coalesce((SELECT sum(n) FROM b), 0)::bigint`

// recordHistory writes one history sample (historySQL): published holds the
// rows this instance published per topic since its previous call. It
// returns the whole backlog, counted up to backlogCap. The heartbeat calls
// it (countBacklog) every backlogEvery-th beat, 10 s by default: a sample
// costs one bounded count and one small insert.
func (r *Relay) recordHistory(ctx context.Context, published map[string]uint64) (backlog int64, err error) {
	topics := make([]string, 0, len(published))
	counts := make([]int64, 0, len(published))
	for t, n := range published {
		topics, counts = append(topics, t), append(counts, int64(n))
	}
	if err := r.cfg.Pool.QueryRow(ctx, historySQL, backlogCap, topics, counts).Scan(&backlog); err != nil {
		return 0, fmt.Errorf("relay: record a history sample: %w", err)
	}
	return backlog, nil
}

// countPublished adds a recorded batch's published rows to the per-topic
// counts the next history sample takes.
func (r *Relay) countPublished(byTopic map[string]uint64) {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	if r.pubByTopic == nil {
		r.pubByTopic = map[string]uint64{}
	}
	for t, n := range byTopic {
		r.pubByTopic[t] += n
	}
}

// takePublished returns and resets the per-topic counts.
func (r *Relay) takePublished() map[string]uint64 {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	m := r.pubByTopic
	r.pubByTopic = nil
	return m
}
