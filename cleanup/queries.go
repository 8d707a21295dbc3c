package cleanup

// All of the cleaner's SQL. Tables are unqualified: they resolve through the
// connection's search_path, like every other pgbox query.

// sqlTryLock takes the session advisory lock that makes one cleaner run at a
// time. The key is derived from pgbox_inbox's OID, so cleaners of different
// schemas in one database do not exclude each other.
const sqlTryLock = `SELECT pg_try_advisory_lock(` + sqlLockKey + `)`

const sqlUnlock = `SELECT pg_advisory_unlock(` + sqlLockKey + `)`

const sqlLockKey = `(hashtext('pgbox_cleanup')::bigint << 32) | 'pgbox_inbox'::regclass::oid::bigint`

const sqlNow = `SELECT now()`

// sqlTopics lists the distinct topics of pgbox_inbox with a loose index scan
// over pgbox_inbox_topic_age_idx: one index probe per topic, however many keys.
const sqlTopics = `
WITH RECURSIVE t AS (
    (SELECT topic FROM pgbox_inbox ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT i.topic FROM pgbox_inbox i WHERE i.topic > t.topic ORDER BY i.topic LIMIT 1)
    FROM t WHERE t.topic IS NOT NULL
)
SELECT topic FROM t WHERE topic IS NOT NULL`

// sqlDeleteInboxBatch deletes one batch of a topic's expired keys, oldest
// first, walking pgbox_inbox_topic_age_idx from $2 (the previous batch's
// newest age, so dead index entries of earlier batches are not rescanned) to
// the cutoff $3 (exclusive). Rows a writer holds locked are skipped, so the
// cleaner never waits on a writer, and a writer waits at most for one batch.
// The DELETE re-checks the predicate next to the ctid, so a ctid can never
// name another row. It returns the batch's size and newest age.
const sqlDeleteInboxBatch = `
WITH batch AS (
    SELECT ctid FROM pgbox_inbox
    WHERE topic = $1
      AND GREATEST(received_at, record_at) >= $2
      AND GREATEST(received_at, record_at) < $3
    ORDER BY GREATEST(received_at, record_at)
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM pgbox_inbox
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch))
      AND topic = $1
      AND GREATEST(received_at, record_at) < $3
    RETURNING GREATEST(received_at, record_at) AS age
)
SELECT count(*), max(age) FROM gone`

// sqlCountInboxExpired counts a topic's keys past the cutoff (dry runs).
const sqlCountInboxExpired = `
SELECT count(*) FROM pgbox_inbox
WHERE topic = $1 AND GREATEST(received_at, record_at) < $2`

// sqlOldestInbox is the age of a topic's oldest key, from the index.
const sqlOldestInbox = `
SELECT GREATEST(received_at, record_at) FROM pgbox_inbox
WHERE topic = $1
ORDER BY GREATEST(received_at, record_at)
LIMIT 1`
