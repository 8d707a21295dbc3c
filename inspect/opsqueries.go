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
// (” any), $3 parked at or before, $4 ids (empty: any).
const parkedWhere = `parked_at IS NOT NULL AND parked_at <= $3
	AND ($1 = '' OR topic = $1)
	AND ($2 = '' OR strpos(coalesce(last_error, ''), $2) > 0)
	AND (cardinality($4::bigint[]) = 0 OR id = ANY($4::bigint[]))`

// sqlParkedList lists matching parked rows in id order, $5 at most, along
// pgbox_outbox_parked_idx, each with the rows it holds back (sqlHeldBy).
const sqlParkedList = `SELECT id, event_id::text, topic, key, attempts, coalesce(last_error, ''), created_at, parked_at, ` + sqlHeldBy + `
FROM pgbox_outbox p WHERE ` + parkedWhere + ` ORDER BY id LIMIT $5`

// sqlHeldBy counts the rows parked row p holds back: the later unparked rows
// of its topic and key, which the relay does not claim while p is parked
// (relay's claim; rows without a key hold nothing). A key's rows share
// its slot, so this walks pgbox_outbox_claim_idx from p's position in its
// slot.
const sqlHeldBy = `(SELECT count(*) FROM pgbox_outbox h
	WHERE p.key IS NOT NULL AND (h.slot, h.id) > (p.slot, p.id) AND h.slot <= p.slot
	  AND h.parked_at IS NULL AND h.topic = p.topic AND h.key = p.key)`

// sqlParkedCount counts the matching parked rows.
const sqlParkedCount = `SELECT count(*) FROM pgbox_outbox WHERE ` + parkedWhere

// sqlParkedRetry unparks one batch: the next $5 matching rows after id $6.
// Attempts restart at 0 and so does the unknown-topic window
// (failing_since); last_error is kept (the relay overwrites it on the next
// failure). The rows the unparked ones held become claimable with them, so
// the relay sends each key's rows in id order. Returns the batch's last id
// (NULL: nothing left) and how many rows it unparked.
const sqlParkedRetry = `WITH b AS (
	SELECT id FROM pgbox_outbox WHERE ` + parkedWhere + ` AND id > $6 ORDER BY id LIMIT $5
), u AS (
	UPDATE pgbox_outbox o SET parked_at = NULL, attempts = 0, failing_since = NULL
	FROM b WHERE o.id = b.id AND o.parked_at IS NOT NULL
	RETURNING o.id, o.slot
), ` + sqlRewind + `
SELECT (SELECT max(id) FROM b), (SELECT count(*) FROM u)`

// sqlParkedDiscard deletes one batch, as sqlParkedRetry.
const sqlParkedDiscard = `WITH b AS (
	SELECT id FROM pgbox_outbox WHERE ` + parkedWhere + ` AND id > $6 ORDER BY id LIMIT $5
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
// $3 dead at or before, $4 ids (empty: any).
const deadWhere = `dead_at <= $3
	AND ($1 = '' OR consumer = $1)
	AND ($2 = '' OR topic = $2)
	AND (cardinality($4::bigint[]) = 0 OR id = ANY($4::bigint[]))`

// sqlDeadList lists matching dead letters in id order, $5 at most.
const sqlDeadList = `SELECT id, consumer, topic, topic_id, partition, "offset", key, attempts, error, dlq_topic, dead_at,
	record_stored, replays, replayed_at, coalesce(replayed_to, '')
FROM pgbox_consumer_dead WHERE ` + deadWhere + ` ORDER BY id LIMIT $5`

// sqlDeadLock reads and locks the dead letters to replay ($1 ids), in id
// order so two replays of overlapping sets cannot deadlock. A second replay
// of a row waits here for the first to commit, then sees its replays count.
const sqlDeadLock = `SELECT id, topic, record_stored, record_key, record_value, record_headers, replays
FROM pgbox_consumer_dead WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE`

// sqlDeadMarkReplayed records the replays written: $1 ids, $2 their topics.
const sqlDeadMarkReplayed = `UPDATE pgbox_consumer_dead d
SET replays = d.replays + 1, replayed_at = now(), replayed_to = r.topic
FROM unnest($1::bigint[], $2::text[]) AS r(id, topic) WHERE d.id = r.id`
