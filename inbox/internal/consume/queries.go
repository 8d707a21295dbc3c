package consume

// The consumer adapter's SQL (pgbox_consumer_attempts and pgbox_consumer_dead,
// from migration 00010). Tables are unqualified, found through search_path.

const (
	// When a claim starts: drop attempt rows the group has committed past
	// (or of an older incarnation of the topic), and list the rest.
	sqlLoadAttempts = `WITH stale AS (
	DELETE FROM pgbox_consumer_attempts
	WHERE consumer = $1 AND topic = $2 AND partition = $3 AND ("offset" < $4 OR topic_id <> $5)
)
SELECT "offset" FROM pgbox_consumer_attempts
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND "offset" >= $4 AND topic_id = $5`

	// After a failed attempt, in its own transaction: count it.
	sqlRecordAttempt = `INSERT INTO pgbox_consumer_attempts AS a
	(consumer, topic, topic_id, partition, "offset", attempts, last_error)
VALUES ($1, $2, $3, $4, $5, 1, $6)
ON CONFLICT (consumer, topic, partition, "offset", topic_id)
DO UPDATE SET attempts = a.attempts + 1, last_error = EXCLUDED.last_error, updated_at = now()
RETURNING attempts`

	// In the transaction that processes or dead-letters the message.
	sqlDeleteAttempts = `DELETE FROM pgbox_consumer_attempts
WHERE consumer = $1 AND topic = $2 AND topic_id = $3 AND partition = $4 AND "offset" = $5`

	// The dead-letter transaction; a conflict means it committed before
	// (redelivered after a crash before the offset mark): write nothing twice.
	// The record itself is kept for replay (inspect.ReplayDead, migration 00040).
	sqlInsertDead = `INSERT INTO pgbox_consumer_dead
	(consumer, topic, topic_id, partition, "offset", key, attempts, error, dlq_topic,
	 record_stored, record_key, record_value, record_headers)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, true, $10, $11, $12)
ON CONFLICT DO NOTHING`
)
