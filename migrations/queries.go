package migrations

// The migrations package's own SQL: what it reads before it lets goose run.
// Tables are looked up in current_schema(), the first existing schema of the
// search_path, which is where the migrations create them (and where goose
// looks for its version table).
const (
	// currentSchemaSQL is NULL when no schema of the search_path exists.
	currentSchemaSQL = `SELECT current_schema(), current_setting('search_path')`

	tableExistsSQL = `SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`

	// liveInstancesSQL lists the relay instances whose registration has not
	// expired: relays that are running (or died less than a lease ago).
	liveInstancesSQL = `SELECT instance FROM %s WHERE expires_at > now() ORDER BY instance`

	countRowsSQL = `SELECT count(*) FROM %s`

	// appliedVersionsSQL reads goose's version table (TableName) directly:
	// goose's own Status takes the migrations' session lock, which would
	// make a starting relay wait for a running `migrate up`, and which a
	// pooler in transaction mode (pgbouncer) cannot hold.
	appliedVersionsSQL = `SELECT DISTINCT version_id FROM %s WHERE is_applied`
)
