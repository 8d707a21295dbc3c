package cleanup

import (
	"strconv"
	"strings"
)

// All of the cleaner's SQL. Tables are unqualified: they resolve through the
// connection's search_path, like every other pgbox query.

// sqlTakeLease takes the lease that makes one cleaner pass run at a time in
// a schema: it inserts the lease row, or takes it over once expired, and
// returns 1 when $1 now holds it for $2, 0 when another pass does. A row, not
// a session advisory lock: behind a transaction-mode pooler (pgbouncer) a
// session lock stays with whichever server session took it, the unlock lands
// on another, and the lock leaks until that server connection closes.
const sqlTakeLease = `WITH took AS (
    INSERT INTO pgbox_cleanup_lease (owner, expires_at) VALUES ($1, now() + $2::interval)
    ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
    WHERE pgbox_cleanup_lease.expires_at <= now()
    RETURNING 1
)
SELECT count(*)::int FROM took`

// sqlRenewLease extends the lease $1 holds by $2; no row means it was lost.
const sqlRenewLease = `UPDATE pgbox_cleanup_lease SET expires_at = now() + $2::interval WHERE owner = $1`

// sqlReleaseLease gives the lease up at the end of a pass.
const sqlReleaseLease = `DELETE FROM pgbox_cleanup_lease WHERE owner = $1`

const sqlNow = `SELECT now()`

// sqlBatchSettings makes a delete batch's commit asynchronous and bounds its
// lock waits (see deleteTx).
const sqlBatchSettings = `SET LOCAL synchronous_commit = off; SET LOCAL lock_timeout = '` + batchLockTimeout + `'`

// batchLockTimeout bounds how long a delete batch waits for a row lock
// before it is retried skipping locked rows.
const batchLockTimeout = "200ms"

// sqlTopics lists the distinct topics of pgbox_inbox with a loose index scan
// over pgbox_inbox_position_idx (topic, partition, offset): one index probe
// per topic, however many keys. It walks the index backwards, so each
// probe lands on a topic's highest-offset key: the entries of keys the
// cleaner deleted sit at the other end of a topic's range, and a held
// snapshot (pg_dump, a long report) keeps them for as long as it lasts; a
// forward probe would walk all of them first. listTopics sorts the answer.
const sqlTopics = `
WITH RECURSIVE t AS (
    (SELECT topic FROM pgbox_inbox ORDER BY topic DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT i.topic FROM pgbox_inbox i WHERE i.topic < t.topic ORDER BY i.topic DESC LIMIT 1)
    FROM t WHERE t.topic IS NOT NULL
)
SELECT topic FROM t WHERE topic IS NOT NULL`

// sqlConsumers is a CTE listing the distinct consumers of pgbox_inbox, in
// a loose index scan over its primary key (consumer, key): one probe per
// consumer. The inbox's only age index, pgbox_inbox_consumer_topic_age_idx,
// leads with the consumer (migration 00130 dropped the per-topic one, to
// spare every insert an index entry), so a topic's keys are read by age one
// consumer at a time and merged.
//
// ORDER BY consumer, key: only the primary key has that order, so the
// probes go there and not to the age index, whose first entries per
// consumer are its oldest keys, the ones cleanup deletes: under a held xmin
// horizon their dead entries stay, and a probe landing on them would walk
// them all. In the primary key, deleted keys are scattered among live ones.
const sqlConsumers = `WITH RECURSIVE c AS (
    (SELECT consumer FROM pgbox_inbox ORDER BY consumer, key LIMIT 1)
    UNION ALL
    SELECT (SELECT i.consumer FROM pgbox_inbox i WHERE i.consumer > c.consumer ORDER BY i.consumer, i.key LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)`

// sqlDeadTopics is sqlTopics for pgbox_consumer_dead, over
// pgbox_consumer_dead_topic_age_idx.
var sqlDeadTopics = strings.ReplaceAll(sqlTopics, "pgbox_inbox", "pgbox_consumer_dead")

// A key's position is its last-seen copy's (topic, partition, offset). It is
// known when position_at, stamped by the inbox whenever it records the
// position, is at least received_at, stamped whenever a copy arrives: a key
// written before migration 00070 (position_at NULL), by a pgbox whose
// duplicate update does not move the position (received_at moved,
// position_at not), or whose copies came on two partitions (position_at set
// NULL) has an unknown position.
const (
	posKnown   = `position_at >= received_at`
	posUnknown = `(position_at IS NULL OR position_at < received_at)`
)

// sqlDeleteInboxExact deletes one batch of the keys of one partition that
// the exact rule lets go: position known, offset below the log start $4,
// age before $5 (now − buffer). It reads the partition's next $6 keys below
// the log start along pgbox_inbox_position_idx from offset $3 (the previous
// batch's highest, or where the previous pass left off: walk.go), whatever
// their age and position, so that it sees the keys it leaves behind; it
// deletes the ones the rule lets go, found by ctid with the predicate
// re-checked (a duplicate that moved a key's position meanwhile keeps it).
// It returns how many keys the batch read, the highest offset among them,
// how many it deleted, how many of them the rule let go, and the lowest
// offset of a key it left behind that the rule may let go later (position
// known, younger than the buffer), NULL when none. Locking as for
// inboxDeleteBatch.
var (
	sqlDeleteInboxExact           = inboxExactBatch("")
	sqlDeleteInboxExactSkipLocked = inboxExactBatch("FOR UPDATE SKIP LOCKED")
)

const predExact = `topic = $1 AND partition = $2 AND "offset" < $4
      AND ` + posKnown + ` AND GREATEST(received_at, record_at) < $5`

func inboxExactBatch(locking string) string {
	take := `SELECT ctid FROM batch WHERE ok`
	if locking != "" {
		// Only the keys it deletes are locked: the ones it leaves stay free
		// for a duplicate delivery's update.
		take = `SELECT ctid FROM pgbox_inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch WHERE ok)) ` + locking
	}
	return `
WITH batch AS MATERIALIZED (
    SELECT ctid, "offset",
           COALESCE(` + posKnown + ` AND GREATEST(received_at, record_at) < $5, false) AS ok,
           COALESCE(` + posKnown + `, false) AS known
    FROM pgbox_inbox
    WHERE topic = $1 AND partition = $2 AND "offset" >= $3 AND "offset" < $4
    ORDER BY "offset"
    LIMIT $6
), take AS MATERIALIZED (
    ` + take + `
), gone AS (
    DELETE FROM pgbox_inbox
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM take)) AND ` + predExact + `
    RETURNING 1
)
SELECT count(*), max("offset"), (SELECT count(*) FROM gone),
       count(*) FILTER (WHERE ok), min("offset") FILTER (WHERE known AND NOT ok)
FROM batch`
}

// sqlCountInboxExact counts what sqlDeleteInboxExact would delete (dry
// runs): $1 topic, $2 partition, $3 log start, $4 now − buffer.
const sqlCountInboxExact = `
SELECT count(*) FROM pgbox_inbox
WHERE topic = $1 AND partition = $2 AND "offset" < $3
  AND ` + posKnown + ` AND GREATEST(received_at, record_at) < $4`

// sqlTopicConsumers lists the consumers holding keys of topic $1: the
// consumers in a loose index scan (sqlConsumers), each probed along
// pgbox_inbox_consumer_topic_age_idx.
const sqlTopicConsumers = sqlConsumers + `
SELECT c.consumer FROM c WHERE c.consumer IS NOT NULL
    AND EXISTS (SELECT FROM pgbox_inbox i WHERE i.consumer = c.consumer AND i.topic = $1)`

// inboxDeleteBatch is the statement that deletes one batch of a topic's
// keys past the time rule's cutoff, oldest first, for a topic whose keys
// belong to n consumers ($6 … $(5+n), from sqlTopicConsumers). Each
// consumer's keys come along pgbox_inbox_consumer_topic_age_idx from $2
// (the previous batch's newest age, so the dead index entries of earlier
// batches are not scanned again) to the cutoff $3 (exclusive), in one
// UNION ALL branch per consumer; the branches are merged by age (a Merge
// Append, which reads each branch only as far as the merge needs: about $4
// rows in all, not $4 per consumer) and the oldest $4 make the batch. It
// deletes the rows found by ctid: the keys of unknown position, or every
// key when $5 (a forced window). The DELETE re-checks the predicate next to
// the ctid, so a ctid can never name another row. It returns how many rows
// the batch selected, the newest age among them, and how many it deleted.
// Every row of any consumer older than that newest age is in the batch, so
// the next batch, from that age on, misses none.
//
// The inbox never locks a committed key for long, so this runs with a short
// lock_timeout and no row locking of its own (locking ""); should a row be
// locked all the same (a duplicate delivery's update, an application's own
// UPDATE), the batch is retried with locking "FOR UPDATE SKIP LOCKED",
// which leaves locked rows for the next pass: the cleaner never waits on a
// writer for long, and a writer waits at most for one batch. (That variant
// locks up to $4 rows per consumer until its short transaction ends.)
func inboxDeleteBatch(locking string, n int) string {
	branches := make([]string, n)
	for i := range branches {
		branches[i] = `(SELECT ctid, GREATEST(received_at, record_at) AS age FROM pgbox_inbox
        WHERE consumer = $` + strconv.Itoa(6+i) + ` AND GREATEST(received_at, record_at) >= $2 AND ` + predTimed + `
        ORDER BY GREATEST(received_at, record_at)
        LIMIT $4 ` + locking + `)`
		if locking != "" {
			// A locking clause is not allowed in a UNION's own branches, only
			// in a subquery below one.
			branches[i] = `(SELECT ctid, age FROM ` + branches[i] + ` l)`
		}
	}
	return `
WITH batch AS MATERIALIZED (
    SELECT ctid, age FROM (` + strings.Join(branches, "\n    UNION ALL ") + `) u
    ORDER BY age
    LIMIT $4
), gone AS (
    DELETE FROM pgbox_inbox
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch)) AND ` + predTimed + `
    RETURNING 1
)
SELECT (SELECT count(*) FROM batch), (SELECT max(age) FROM batch), (SELECT count(*) FROM gone)`
}

const predTimed = `topic = $1
      AND GREATEST(received_at, record_at) < $3
      AND ($5 OR ` + posUnknown + `)`

// sqlCountInboxTimed counts what the time rule would delete (dry runs): $1
// topic, $2 cutoff, $3 every key (a forced window), leaving out the keys the
// exact rule takes first ($4 partitions, $5 their log starts, $6 now − buffer).
// It reads each consumer's keys older than the cutoff along
// pgbox_inbox_consumer_topic_age_idx (sqlConsumers).
const sqlCountInboxTimed = sqlConsumers + `
SELECT count(*) FROM c, LATERAL (
    SELECT 1 FROM pgbox_inbox i
    WHERE i.consumer = c.consumer AND topic = $1 AND GREATEST(received_at, record_at) < $2
      AND ($3 OR ` + posUnknown + `)
      AND NOT COALESCE(` + posKnown + ` AND GREATEST(received_at, record_at) < $6 AND "offset" < COALESCE(
          (SELECT u.start FROM unnest($4::int4[], $5::int8[]) AS u(partition, start) WHERE u.partition = i.partition), -1), false)) k
WHERE c.consumer IS NOT NULL`

// sqlOldestInbox is the age of a topic's oldest key: each consumer's oldest
// of the topic from pgbox_inbox_consumer_topic_age_idx (sqlConsumers),
// looked for from $2 on (the previous pass's answer, or -infinity:
// walk.go), the oldest of those. No row when the topic has no keys.
const sqlOldestInbox = sqlConsumers + `
SELECT o.age FROM c, LATERAL (
    SELECT GREATEST(received_at, record_at) AS age FROM pgbox_inbox
    WHERE consumer = c.consumer AND topic = $1 AND GREATEST(received_at, record_at) >= $2
    ORDER BY GREATEST(received_at, record_at)
    LIMIT 1) o
WHERE c.consumer IS NOT NULL
ORDER BY o.age
LIMIT 1`

// Batch deletes of the other pgbox tables, by age along an index; the same
// shape as the inbox's (ctid batch, predicate re-checked, lock-skipping
// variant), without keyset paging: these tables hold only failures.
// Arguments: $1 cutoff (exclusive), then $2 topic for per-topic ones, then the
// batch size.
func tableDeleteBatch(table, pred, order, limitArg, locking string) string {
	return `
WITH batch AS MATERIALIZED (
    SELECT ctid FROM ` + table + ` WHERE ` + pred + ` ORDER BY ` + order + ` LIMIT ` + limitArg + ` ` + locking + `
), gone AS (
    DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch)) AND ` + pred + `
    RETURNING 1
)
SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM gone)`
}

const (
	predParked   = `parked_at IS NOT NULL AND parked_at < $1`
	predDead     = `topic = $2 AND dead_at < $1`
	predAttempts = `updated_at < $1`
	skipLocked   = `FOR UPDATE SKIP LOCKED`
)

var (
	// Parked outbox rows, along pgbox_outbox_parked_idx.
	sqlDeleteParked           = tableDeleteBatch("pgbox_outbox", predParked, "parked_at", "$2", "")
	sqlDeleteParkedSkipLocked = tableDeleteBatch("pgbox_outbox", predParked, "parked_at", "$2", skipLocked)
	sqlCountParked            = `SELECT count(*) FROM pgbox_outbox WHERE ` + predParked

	// Dead letters of one source topic, along pgbox_consumer_dead_topic_age_idx.
	sqlDeleteDead           = tableDeleteBatch("pgbox_consumer_dead", predDead, "dead_at", "$3", "")
	sqlDeleteDeadSkipLocked = tableDeleteBatch("pgbox_consumer_dead", predDead, "dead_at", "$3", skipLocked)
	sqlCountDead            = `SELECT count(*) FROM pgbox_consumer_dead WHERE ` + predDead

	// Stale attempt rows, along pgbox_consumer_attempts_age_idx.
	sqlDeleteAttempts           = tableDeleteBatch("pgbox_consumer_attempts", predAttempts, "updated_at", "$2", "")
	sqlDeleteAttemptsSkipLocked = tableDeleteBatch("pgbox_consumer_attempts", predAttempts, "updated_at", "$2", skipLocked)
	sqlCountAttempts            = `SELECT count(*) FROM pgbox_consumer_attempts WHERE ` + predAttempts
)
