package inbox

// All of the package's SQL. Tables are unqualified: they resolve through the
// connection's search_path, like the migrations that create them.

const (
	savepointName = "pgbox_inbox"

	sqlSavepoint = `SAVEPOINT ` + savepointName
	// One simple-protocol Exec (no arguments) runs both statements.
	sqlRollbackRelease = `ROLLBACK TO SAVEPOINT ` + savepointName + `; RELEASE SAVEPOINT ` + savepointName

	// Sets lock_timeout for the dedup insert only, keeping the caller's value
	// in a custom setting so sqlRestoreLockTimeout can put it back within the
	// same pipeline. Both are transaction-local (is_local = true); if the
	// insert fails, ROLLBACK TO SAVEPOINT undoes them anyway.
	sqlSetLockTimeout = `SELECT set_config('pgbox.saved_lock_timeout', current_setting('lock_timeout'), true),
	set_config('lock_timeout', $1, true)`
	sqlRestoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('pgbox.saved_lock_timeout'), true)`

	// The dedup step. It inserts one row when the key is new, none on
	// conflict (the command tag says which).
	// (A single statement that also returns the stored row on conflict, a
	// data-modifying CTE, measured about 15% slower on the common, new-key
	// path; and under READ COMMITTED its snapshot cannot see a row committed
	// by the concurrent transaction it waited for anyway.)
	sqlInsertOne = `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", fingerprint, record_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, key) DO NOTHING`

	sqlSetResult = `UPDATE pgbox_inbox SET result = $3 WHERE consumer = $1 AND key = $2`

	// The batch dedup step, in three forms that share sqlInsertManyRows and
	// its key order (bytewise: any fixed order will do, and "C" is the
	// cheapest), so that two batches with overlapping keys lock them in the
	// same order and cannot deadlock. RETURNING lists the keys inserted; the
	// rest were seen before.
	//
	// sqlInsertManyNew, the first try: every key inserted plainly, without
	// ON CONFLICT's speculative insertion (a speculative-insertion lock and
	// an extra WAL record per row) and without a probe for keys already there
	// (an index descent per key); 13–17% off a 100-key transaction, measured.
	// A key committed before makes the insert fail with a unique violation
	// (23505) at once; a key that another transaction inserted and has not
	// committed makes it wait on the unique index, then fail if that
	// transaction commits. ProcessBatch then rolls back to its savepoint and
	// runs the batch through sqlInsertMany, or, when the caller owns the
	// transaction, returns an owntx.Conflict for the caller to run it again;
	// either way the Inbox probes first for probeWindow (redeliveries come
	// in runs).
	sqlInsertManyNew = sqlInsertManyRows + sqlInsertManyOrder + `RETURNING key`

	// sqlInsertManyProbe, within the probe window: an index probe first
	// drops the keys already committed, so a run of redelivered batches does
	// not fail and retry each batch.
	sqlInsertManyProbe = sqlInsertManyRows +
		`WHERE NOT EXISTS (SELECT FROM pgbox_inbox p WHERE p.consumer = $1 AND p.key = u.key)
` + sqlInsertManyOrder + `RETURNING key`

	// sqlInsertMany, after a failed first try (and for an owned transaction
	// within the probe window): ON CONFLICT skips the keys seen before,
	// waiting for any in flight.
	sqlInsertMany = sqlInsertManyRows + sqlInsertManyOrder + `ON CONFLICT (consumer, key) DO NOTHING
RETURNING key`

	// sqlInsertManyRows is the batch's rows. $8 says per key whether its
	// position is known (false: the batch saw it on two partitions;
	// position_at NULL, see sqlTouchOne).
	sqlInsertManyRows = `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", fingerprint, record_at, position_at)
SELECT $1, key, topic, partition, "offset", fingerprint, record_at, CASE WHEN known THEN now() END
FROM unnest($2::text[], $3::text[], $4::int4[], $5::int8[], $6::bytea[], $7::timestamptz[], $8::bool[])
	AS u(key, topic, partition, "offset", fingerprint, record_at, known)
`
	sqlInsertManyOrder = `ORDER BY key COLLATE "C"
`

	sqlSetResults = `UPDATE pgbox_inbox p SET result = u.result
FROM unnest($2::text[], $3::bytea[]) AS u(key, result)
WHERE p.consumer = $1 AND p.key = u.key`

	// The watermark modes. One row per (consumer, topic, partition), moved
	// forward in the caller's transaction. The WHERE clause makes a record at
	// or below the watermark update nothing (no row returned: a duplicate);
	// under READ COMMITTED a concurrent delivery of the same partition waits
	// for the row lock, then re-checks against the committed offset. A
	// different non-empty topic id is a new incarnation of the topic (deleted
	// and recreated): the row starts over at this offset, previous_offset
	// NULL. An empty id on either side compares offsets only (ids turned on
	// or off keeps the row). RETURNING previous_offset (the old value, saved
	// by SET) tells the caller of a gap.
	sqlWatermarkNewIncarnation = `(w.topic_id <> '' AND EXCLUDED.topic_id <> '' AND w.topic_id <> EXCLUDED.topic_id)`
	sqlWatermarkConflict       = `
ON CONFLICT (consumer, topic, partition) DO UPDATE SET
	"offset" = EXCLUDED."offset",
	previous_offset = CASE WHEN ` + sqlWatermarkNewIncarnation + ` THEN NULL ELSE w."offset" END,
	topic_id = CASE WHEN EXCLUDED.topic_id = '' THEN w.topic_id ELSE EXCLUDED.topic_id END,
	updated_at = now()
WHERE w."offset" < EXCLUDED."offset" OR ` + sqlWatermarkNewIncarnation

	sqlWatermarkOne = `INSERT INTO pgbox_inbox_watermark AS w (consumer, topic, partition, topic_id, "offset")
VALUES ($1, $2, $3, $4, $5)` + sqlWatermarkConflict + `
RETURNING previous_offset`

	// One row per (topic, partition) of the batch, carrying its highest
	// offset, in a fixed order so that concurrent batches cannot deadlock.
	sqlWatermarkMany = `INSERT INTO pgbox_inbox_watermark AS w (consumer, topic, partition, topic_id, "offset")
SELECT $1, topic, partition, topic_id, "offset"
FROM unnest($2::text[], $3::int4[], $4::text[], $5::int8[]) AS u(topic, partition, topic_id, "offset")
ORDER BY topic COLLATE "C", partition` + sqlWatermarkConflict + `
RETURNING topic, partition, previous_offset`
)

var (
	// On conflict: the stored row, read by a new statement, whose snapshot
	// includes a row committed by a transaction the insert waited for. A
	// duplicate delivery also moves the key's times forward: the duplicate
	// is a later copy of the record (a relay re-send after its crash window),
	// still in Kafka after the first copy's retention ran out, so cleanup
	// must keep the key as long as this copy can come back ($3 is its record
	// timestamp; GREATEST ignores NULLs). It moves the key's last-seen
	// position too, for cleanup's exact rule (log start offset past the
	// position): to this copy's offset on the same partition ($4, $5, $6),
	// never backwards (a rewind redelivering an older copy); a copy on
	// another partition or topic, or a position already unknown, makes the
	// position unknown (position_at NULL: cleanup's time rule then decides).
	sqlTouchOne = `UPDATE pgbox_inbox SET received_at = now(), record_at = GREATEST(record_at, $3),
	` + sqlTouchPosition("", "$4", "$5", "$6") + `
WHERE consumer = $1 AND key = $2 RETURNING fingerprint, result`

	// sqlTouchMany is sqlTouchOne for a batch's conflicting keys: rows are
	// locked in key order (as the insert takes them) so that concurrent
	// batches with overlapping duplicates cannot deadlock.
	sqlTouchMany = `WITH locked AS (
	SELECT p.key, u.record_at, u.topic, u.partition, u."offset" FROM pgbox_inbox p
	JOIN unnest($2::text[], $3::timestamptz[], $4::text[], $5::int4[], $6::int8[])
		AS u(key, record_at, topic, partition, "offset") ON p.key = u.key
	WHERE p.consumer = $1 ORDER BY p.key COLLATE "C" FOR UPDATE OF p)
UPDATE pgbox_inbox p SET received_at = now(), record_at = GREATEST(p.record_at, l.record_at),
	` + sqlTouchPosition("p.", "l.topic", "l.partition", `l."offset"`) + `
FROM locked l WHERE p.consumer = $1 AND p.key = l.key
RETURNING p.key, p.fingerprint, p.result`
)

// sqlTouchPosition is the SET list that moves a key's last-seen position to
// a duplicate copy's (see sqlTouchOne). SET expressions read the row as it
// was, so position_at >= received_at is the old row's "position known".
// row qualifies the stored row's columns ("p." where the UPDATE has a FROM).
func sqlTouchPosition(row, topic, partition, offset string) string {
	same := row + `topic = ` + topic + ` AND ` + row + `partition = ` + partition +
		` AND ` + row + `position_at >= ` + row + `received_at`
	return `"offset" = CASE WHEN ` + same + ` THEN GREATEST(` + row + `"offset", ` + offset + `) ELSE ` + row + `"offset" END,
	position_at = CASE WHEN ` + same + ` THEN now() END`
}
