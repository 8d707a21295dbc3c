package inspect

// The SQL of story.go: reading one key's rows and one row's payload. Every
// query follows an index or reads a table that stays small (dead letters).

// outboxCols are the columns an OutboxRow is scanned from.
const outboxCols = `id, event_id::text, slot, topic, key, value, headers, created_at, attempts, coalesce(last_error, ''), parked_at`

// sqlStoryOutbox finds a key's outbox rows: the unparked ones along
// pgbox_outbox_claim_idx (slot $1: every row of a key has its key's slot),
// the parked ones along pgbox_outbox_parked_idx. $2 topic, $3 key, $4 limit.
const sqlStoryOutbox = `(SELECT ` + outboxCols + ` FROM pgbox_outbox
	WHERE slot = $1::smallint AND parked_at IS NULL AND topic = $2 AND key = $3 ORDER BY id LIMIT $4)
UNION ALL
(SELECT ` + outboxCols + ` FROM pgbox_outbox
	WHERE parked_at IS NOT NULL AND topic = $2 AND key = $3 ORDER BY id LIMIT $4)`

// sqlStoryOutboxParkedEvent finds a parked row by event id ($1), along
// pgbox_outbox_parked_idx. Unparked rows have no event-id index; their
// lookup goes through the key (sqlStoryOutbox).
const sqlStoryOutboxParkedEvent = `SELECT ` + outboxCols + ` FROM pgbox_outbox
	WHERE parked_at IS NOT NULL AND event_id = $1::uuid LIMIT 1`

// sqlStoryDead finds the dead letters of a key: the record's key ($2) on
// its source topic ($1), or an inbox key among $3. $4 limit.
const sqlStoryDead = `SELECT id, consumer, topic, topic_id, partition, "offset", key, attempts, error, dlq_topic, dead_at,
	record_stored, replays, replayed_at, coalesce(replayed_to, '')
FROM pgbox_consumer_dead
WHERE (topic = $1 AND record_key = $2) OR key = ANY($3::text[])
ORDER BY id LIMIT $4`

// sqlStoryInbox probes every consumer's inbox for the keys $1: the
// consumers in a loose index scan over the primary key (consumer, key),
// then one probe of the same index per consumer and key.
const sqlStoryInbox = `WITH RECURSIVE c AS (
    (SELECT consumer FROM pgbox_inbox ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT i.consumer FROM pgbox_inbox i WHERE i.consumer > c.consumer ORDER BY i.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT i.consumer, i.key, i.topic, i.partition, i."offset", i.received_at, i.record_at
FROM c JOIN pgbox_inbox i ON i.consumer = c.consumer AND i.key = ANY($1::text[])
WHERE c.consumer IS NOT NULL
ORDER BY i.consumer, i.received_at`

// sqlOutboxRow reads one outbox row by id.
const sqlOutboxRow = `SELECT ` + outboxCols + ` FROM pgbox_outbox WHERE id = $1`

// sqlDeadRecord reads one dead letter and its stored record by id.
const sqlDeadRecord = `SELECT id, consumer, topic, topic_id, partition, "offset", key, attempts, error, dlq_topic, dead_at,
	record_stored, replays, replayed_at, coalesce(replayed_to, ''), record_key, record_value, record_headers
FROM pgbox_consumer_dead WHERE id = $1`
