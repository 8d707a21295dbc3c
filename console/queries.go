package console

// The console's own SQL: its audit trail (migrations 00090 and 00110), the
// shared CSRF key and the history samples it charts (migration 00110).
// Everything else it reads and does goes through package inspect.

// sqlAuditStart records an action before it runs ($1 actor, $2 role, $3
// action, $4 target, $5 how the actor authenticated), so that no action goes
// unrecorded; sqlAuditFinish completes the record.
const sqlAuditStart = `INSERT INTO pgbox_console_audit (actor, role, action, target, method, result)
VALUES ($1, $2, $3, $4, $5, 'started') RETURNING id`

// sqlAuditFinish sets a record's rows ($2), count ($3) and result ($4).
const sqlAuditFinish = `UPDATE pgbox_console_audit SET row_ids = $2, affected = $3, result = $4 WHERE id = $1`

// sqlAuditList lists the newest $1 records, along the primary key.
const sqlAuditList = `SELECT id, at, actor, role, method, action, target, row_ids, affected, result
FROM pgbox_console_audit ORDER BY id DESC LIMIT $1`

// sqlAuditOne reads one record.
const sqlAuditOne = `SELECT id, at, actor, role, method, action, target, row_ids, affected, result
FROM pgbox_console_audit WHERE id = $1`

// sqlSecret reads the named shared secret ($1), creating it with $2 when
// no console has yet: the first writer wins, every console reads its value.
const sqlSecret = `WITH ins AS (
	INSERT INTO pgbox_console_secret (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING value
)
SELECT value FROM ins UNION ALL SELECT value FROM pgbox_console_secret WHERE name = $1 LIMIT 1`

// sqlHistory reads the relay's history samples of the last $1 seconds
// (pgbox_relay_history, written by the relay's heartbeat), along its
// time index: per sample time and topic, the backlog (the largest any
// instance counted) and the rows published (summed over instances).
// Topic ” marks a sample without rows of any topic.
const sqlHistory = `SELECT date_bin($2::float8 * interval '1 second', at, 'epoch'::timestamptz) AS t, topic, max(backlog), sum(published)::bigint
FROM pgbox_relay_history WHERE at > now() - $1::float8 * interval '1 second'
GROUP BY 1, 2 ORDER BY 1, 2`
