package inspect

// The operator commands' SQL (ops.go, opsdead.go). Each write is one short
// batch, by id, that re-checks its row-level condition (parked_at IS NOT
// NULL) in the statement itself: a row the relay or another operator changed
// meanwhile is left alone, so a concurrent publish, park or retry is never
// undone.

// sqlOpsCutoff turns a minimum age ($1 seconds) into a fixed time on the
// database's clock, read once per operation.
const sqlOpsCutoff = `SELECT now() - $1::float8 * interval '1 second'`

// parkedWhere selects parked rows: $1 topic (” any), $2 error substring
// (” any), $3 parked at or before, $4 ids (empty: any), $5 key (NULL: any).
// Every condition is in the statement, so a LIMIT applies after all of them.
const parkedWhere = `parked_at IS NOT NULL AND parked_at <= $3
	AND ($1 = '' OR topic = $1)
	AND ($2 = '' OR strpos(coalesce(last_error, ''), $2) > 0)
	AND (cardinality($4::bigint[]) = 0 OR id = ANY($4::bigint[]))
	AND ($5::bytea IS NULL OR key = $5::bytea)`

// sqlParkedList lists matching parked rows in id order, $6 at most, along
// pgbox_outbox_parked_idx, each with the rows it holds back (heldBy,
// reading at most $7 of them; $7 = 0: not counted).
var sqlParkedList = `WITH p AS (
	SELECT id, event_id, slot, topic, key, attempts, last_error, created_at, parked_at
	FROM pgbox_outbox WHERE ` + parkedWhere + ` ORDER BY id LIMIT $6
)
SELECT p.id, p.event_id::text, p.topic, p.key, p.attempts, coalesce(p.last_error, ''), p.created_at, p.parked_at, hb.held, hb.capped
FROM p, ` + heldBy("$7") + ` ORDER BY p.id`

// heldBy counts the rows each parked row p holds back: the later unparked
// rows of its topic and key, which the relay does not claim while p is
// parked (relay's claim; rows without a key hold nothing). A key's rows
// share its slot, and no index finds a key's unparked rows, so this walks
// pgbox_outbox_claim_idx from p's position in its slot (in the index's own
// order: with "slot = p.slot ORDER BY id" a planner may walk the primary key
// instead, through every later row of the table), reading at most
// scan (a parameter) rows: past them, capped is set and held is a lower
// bound; scan 0 reads none. A parked row at the head of a large backlog
// would otherwise read its whole slot, a heap fetch per row (a
// 1,000,000-row backlog has about 4,000 rows per slot).
func heldBy(scan string) string {
	return `LATERAL (
	SELECT count(*) FILTER (WHERE w.topic = p.topic AND w.key = p.key) AS held, count(*) > ` + scan + `::int AS capped
	FROM (SELECT h.topic, h.key FROM pgbox_outbox h
		WHERE ` + scan + `::int > 0 AND p.key IS NOT NULL AND (h.slot, h.id) > (p.slot, p.id) AND h.slot <= p.slot AND h.parked_at IS NULL
		ORDER BY h.slot, h.id LIMIT ` + scan + `::int + 1) w
) hb`
}

// sqlParkedCount counts the matching parked rows.
const sqlParkedCount = `SELECT count(*) FROM pgbox_outbox WHERE ` + parkedWhere

// sqlParkedRetry unparks one batch: the next $6 matching rows after id $7.
// Attempts restart at 0 and so does the unknown-topic window
// (failing_since); last_error is kept (the relay overwrites it on the next
// failure). The rows the unparked ones held become claimable with them, so
// the relay sends each key's rows in id order. Returns the batch's last id
// (NULL: nothing left) and how many rows it unparked.
const sqlParkedRetry = `WITH b AS (
	SELECT id FROM pgbox_outbox WHERE ` + parkedWhere + ` AND id > $7 ORDER BY id LIMIT $6
), u AS (
	UPDATE pgbox_outbox o SET parked_at = NULL, attempts = 0, failing_since = NULL
	FROM b WHERE o.id = b.id AND o.parked_at IS NOT NULL
	RETURNING o.id, o.slot
), ` + sqlRewind + `
SELECT (SELECT max(id) FROM b), (SELECT count(*) FROM u)`

// sqlParkedDiscard deletes one batch, as sqlParkedRetry.
const sqlParkedDiscard = `WITH b AS (
	SELECT id FROM pgbox_outbox WHERE ` + parkedWhere + ` AND id > $7 ORDER BY id LIMIT $6
), u AS (
	DELETE FROM pgbox_outbox o USING b WHERE o.id = b.id AND o.parked_at IS NOT NULL
	RETURNING o.id, o.slot
), ` + sqlRewind + `
SELECT (SELECT max(id) FROM b), (SELECT count(*) FROM u)`

// sqlRewind: unparking or deleting a parked row records a rewind (the
// outbox's triggers, migration 00120, whoever runs the statement): the
// relay's claim passes rows a parked row holds back, and starts each slot
// at a floor above them (relay/floor.go); the rewind makes the next claim
// of the slot start no later than the parked row again, so the row
// (retried) or the rows it held (both) are claimed in id order.
//
// Naming pgbox_outbox_rewinds here takes its ROW EXCLUSIVE lock before the
// statement runs; it conflicts with the SHARE lock every claim takes
// first, so the action commits before a claim starts or after it ends,
// never between the claim's reads. Rewinds older than an hour go in the
// same statement: a relay that has not claimed for ten minutes forgets its
// floors anyway (relay/floor.go).
const sqlRewind = `rwgone AS (
	DELETE FROM pgbox_outbox_rewinds WHERE created_at < now() - interval '1 hour'
)`

// deadWhere selects dead letters: $1 consumer (” any), $2 topic (” any),
// $3 dead at or before, $4 ids (empty: any), $5 the inbox key or the
// record's key (” any), $6 error substring (” any). Every condition is in
// the statement, so a LIMIT applies after all of them.
const deadWhere = `dead_at <= $3
	AND ($1 = '' OR consumer = $1)
	AND ($2 = '' OR topic = $2)
	AND (cardinality($4::bigint[]) = 0 OR id = ANY($4::bigint[]))
	AND ($5 = '' OR key = $5 OR record_key = convert_to($5, 'UTF8'))
	AND ($6 = '' OR strpos(error, $6) > 0)`

// sqlDeadList lists matching dead letters in id order, $7 at most.
const sqlDeadList = `SELECT id, consumer, topic, topic_id, partition, "offset", key, attempts, error, dlq_topic, dead_at,
	record_stored, replays, replayed_at, coalesce(replayed_to, '')
FROM pgbox_consumer_dead WHERE ` + deadWhere + ` ORDER BY id LIMIT $7`

// sqlDeadLock reads and locks the dead letters to replay ($1 ids), in id
// order so two replays of overlapping sets cannot deadlock. A second replay
// of a row waits here for the first to commit, then sees its replays count.
const sqlDeadLock = `SELECT id, topic, record_stored, record_key, record_value, record_headers, replays
FROM pgbox_consumer_dead WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE`

// sqlDeadMarkReplayed records the replays written: $1 ids, $2 their topics.
const sqlDeadMarkReplayed = `UPDATE pgbox_consumer_dead d
SET replays = d.replays + 1, replayed_at = now(), replayed_to = r.topic
FROM unnest($1::bigint[], $2::text[]) AS r(id, topic) WHERE d.id = r.id`
