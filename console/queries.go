package console

// The console's own SQL: its audit trail (migration 00090). Everything else
// it reads and does goes through package inspect.

// sqlAuditStart records an action before it runs ($1 actor, $2 role, $3
// action, $4 target), so that no action goes unrecorded; sqlAuditFinish
// completes the record.
const sqlAuditStart = `INSERT INTO pgbox_console_audit (actor, role, action, target, result)
VALUES ($1, $2, $3, $4, 'started') RETURNING id`

// sqlAuditFinish sets a record's rows ($2), count ($3) and result ($4).
const sqlAuditFinish = `UPDATE pgbox_console_audit SET row_ids = $2, affected = $3, result = $4 WHERE id = $1`

// sqlAuditList lists the newest $1 records, along the primary key.
const sqlAuditList = `SELECT id, at, actor, role, action, target, row_ids, affected, result
FROM pgbox_console_audit ORDER BY id DESC LIMIT $1`

// sqlAuditOne reads one record.
const sqlAuditOne = `SELECT id, at, actor, role, action, target, row_ids, affected, result
FROM pgbox_console_audit WHERE id = $1`
