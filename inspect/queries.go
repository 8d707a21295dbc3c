package inspect

// All of inspect's SQL. Every query is bounded by an index or a LIMIT, so a
// snapshot costs about the same with an empty outbox and a 5-million-row
// backlog; counts that would need a scan are bounded counts that become
// planner estimates past Config.ExactLimit. Tables are unqualified: they
// resolve through the connection's search_path.

const sqlLanes = `SELECT lane, lanes, coalesce(owner, ''), expires_at > now(), epoch,
	CASE WHEN expires_at > now() THEN extract(epoch FROM expires_at - now()) ELSE 0 END::float8
FROM pgbox_relay_lanes ORDER BY lane`

const sqlInstances = `SELECT instance, started_at, heartbeat_at, expires_at > now(), kafka_ready, kafka_down_since, sleeping
FROM pgbox_relay_instances ORDER BY instance`

// sqlStart bounds the snapshot's statements (SET LOCAL statement_timeout:
// $1) and reads the clock every age is measured from.
const sqlStart = `SELECT now() FROM set_config('statement_timeout', $1, true)`

// sqlUnpublishedBounded counts unparked rows up to $1, along
// pgbox_outbox_claim_idx.
const sqlUnpublishedBounded = `SELECT count(*) FROM (SELECT 1 FROM pgbox_outbox WHERE parked_at IS NULL LIMIT $1) s`

// sqlBacklogExact groups the unparked rows by topic and slot (readBacklog
// groups slots into lanes with internal/slot.Lane); run only when
// sqlUnpublishedBounded found fewer than the exact limit.
const sqlBacklogExact = `SELECT topic, slot::int, count(*)::bigint
FROM pgbox_outbox WHERE parked_at IS NULL GROUP BY 1, 2`

// sqlBacklogLive is the outbox's live rows from the cumulative statistics
// (pg_stat_get_live_tuples: every committed insert and delete, a second or
// so late), which no ANALYZE has to refresh. Migration 00150 makes the
// outbox's analyzes rare (after 10,000 changed rows), and the claim
// index's pg_class.reltuples, which the estimate read before, stayed at
// the last analyze's figure meanwhile: 8,000 rows were reported as the
// exact limit, 1,000 (TestBacklogEstimateWithoutAnalyze).
//
// They include parked rows, which are taken off: counted through the
// parked index up to $1 (the exact limit), past it at least the parked
// index's pg_class.reltuples. (reltuples alone stayed at the last
// analyze's figure after an operator retried or discarded parked rows:
// 6,000 rows were reported as 2,000, TestAttack150BacklogEstimateAfterOperatorRetry.)
//
// The live rows are a count only once a VACUUM or an ANALYZE has set them
// since the table's statistics were reset (pg_stat_reset, a crash or an
// immediate shutdown); until then they are the inserts less the deletes
// since the reset (clamped at 0), and the claim index's reltuples, the
// last figure before the reset, is a floor (20,100 rows were reported as
// the exact limit after a reset and some traffic,
// TestAttack150BacklogEstimateAfterStatsResetWithTraffic).
const sqlBacklogLive = `SELECT greatest(CASE WHEN coalesce(pg_stat_get_last_vacuum_time(r.o), pg_stat_get_last_autovacuum_time(r.o),
		pg_stat_get_last_analyze_time(r.o), pg_stat_get_last_autoanalyze_time(r.o)) IS NOT NULL
	THEN pg_stat_get_live_tuples(r.o) - p.n
	ELSE greatest(pg_stat_get_live_tuples(r.o) - p.n,
		(SELECT reltuples FROM pg_class WHERE oid = 'pgbox_outbox_claim_idx'::regclass)) END, 0)::bigint
FROM (SELECT 'pgbox_outbox'::regclass AS o) r,
     (SELECT CASE WHEN c.n < $1 THEN c.n
             ELSE greatest(c.n, (SELECT reltuples FROM pg_class WHERE oid = 'pgbox_outbox_parked_idx'::regclass)) END AS n
      FROM (SELECT count(*) AS n FROM (SELECT 1 FROM pgbox_outbox WHERE parked_at IS NOT NULL LIMIT $1) x) c) p`

// sqlBacklogEstimate splits $1 rows (sqlBacklogLive) per topic by each
// topic's share among the outbox's most common topics (pg_stats, kept by
// ANALYZE). Topics too rare to be among the most common values, and every
// topic of an outbox never analyzed, are missing from it.
const sqlBacklogEstimate = `SELECT v.topic, round($1::bigint * v.freq)::bigint
FROM pg_stats s,
     unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(topic, freq)
WHERE s.schemaname = (SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'pgbox_outbox'::regclass)
  AND s.tablename = 'pgbox_outbox' AND s.attname = 'topic'
ORDER BY 1`

// sqlOldestPerSlot finds each slot's oldest unparked row: one probe of
// pgbox_outbox_claim_idx (slot, id) per slot, $1 (internal/slot.Count) in all,
// whatever the backlog. Lanes are groups of slots (slot.Lane). The slot is
// a range of one and the order (slot, id), the claim index's: with
// "slot = s ORDER BY id" the planner, seeing few slots hold rows, walked the
// primary key for each empty slot, through the whole table.
const sqlOldestPerSlot = `SELECT s.slot, (SELECT o.created_at FROM pgbox_outbox o
	WHERE o.slot >= s.slot::smallint AND o.slot <= s.slot::smallint AND o.parked_at IS NULL ORDER BY o.slot, o.id LIMIT 1)
FROM generate_series(0, $1::int - 1) AS s(slot)`

// sqlParkedBounded counts parked rows per topic, the first $1 of them, along
// pgbox_outbox_parked_idx.
const sqlParkedBounded = `SELECT topic, count(*)::bigint
FROM (SELECT topic FROM pgbox_outbox WHERE parked_at IS NOT NULL LIMIT $1) s GROUP BY 1 ORDER BY 1`

// sqlParkedNewest lists the newest $1 parked rows, each with the rows it
// holds back (heldBy, reading at most $2 of them).
var sqlParkedNewest = `WITH p AS (
	SELECT id, event_id, slot, topic, key, attempts, last_error, parked_at
	FROM pgbox_outbox WHERE parked_at IS NOT NULL ORDER BY parked_at DESC, id DESC LIMIT $1
)
SELECT p.id, p.event_id::text, p.topic, p.attempts, coalesce(p.last_error, ''), p.parked_at, hb.held, hb.capped
FROM p, ` + heldBy("$2") + ` ORDER BY p.parked_at DESC, p.id DESC`

// sqlInboxOldest lists every (consumer, topic) pair of the inbox with its
// oldest key, in a loose index scan over pgbox_inbox_consumer_topic_age_idx
// (each step jumps to the next pair and lands on its oldest key), and counts
// each pair's keys up to $1 along the same index.
const sqlInboxOldest = `
WITH RECURSIVE p AS (
    (SELECT consumer, topic, GREATEST(received_at, record_at) AS oldest FROM pgbox_inbox
     ORDER BY consumer, topic, GREATEST(received_at, record_at) LIMIT 1)
    UNION ALL
    SELECT n.consumer, n.topic, n.oldest FROM p, LATERAL (
        SELECT i.consumer, i.topic, GREATEST(i.received_at, i.record_at) AS oldest FROM pgbox_inbox i
        WHERE (i.consumer, i.topic) > (p.consumer, p.topic)
        ORDER BY i.consumer, i.topic, GREATEST(i.received_at, i.record_at) LIMIT 1) n
)
SELECT p.consumer, p.topic, p.oldest,
    (SELECT count(*) FROM (SELECT 1 FROM pgbox_inbox k WHERE k.consumer = p.consumer AND k.topic = p.topic LIMIT $1) c)
FROM p`

// sqlInboxKeysEstimate is the planner's estimate of one pair's keys (its
// EXPLAIN, which reads statistics only).
const sqlInboxKeysEstimate = `EXPLAIN (FORMAT JSON) SELECT 1 FROM pgbox_inbox WHERE consumer = $1 AND topic = $2`

// sqlDeadCounts lists every (consumer, topic) pair of the dead letters in
// a loose index scan over their primary key (consumer, topic, partition,
// offset, topic_id): each step jumps to the next pair. It counts each
// pair's dead letters along the same index, $1 + 1 at most: a count past
// $1 is capped there.
const sqlDeadCounts = `
WITH RECURSIVE p AS (
    (SELECT consumer, topic FROM pgbox_consumer_dead ORDER BY consumer, topic LIMIT 1)
    UNION ALL
    SELECT n.consumer, n.topic FROM p, LATERAL (
        SELECT d.consumer, d.topic FROM pgbox_consumer_dead d
        WHERE (d.consumer, d.topic) > (p.consumer, p.topic)
        ORDER BY d.consumer, d.topic LIMIT 1) n
)
SELECT p.consumer, p.topic,
    (SELECT count(*) FROM (SELECT 1 FROM pgbox_consumer_dead k WHERE k.consumer = p.consumer AND k.topic = p.topic LIMIT $1::int + 1) c)
FROM p ORDER BY 1, 2`
