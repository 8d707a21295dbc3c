package pgxsql

// All of the package's SQL.

const (
	// probeSQL is what ExecContext is called with. pgx never sends it (the
	// hook replaces it); a driver that is not pgx's and takes any argument
	// runs it: it reads nothing and writes nothing.
	probeSQL = `SELECT $1::text WHERE false`

	// noStatement replaces the probe when fn has nothing to send: pgx sends
	// it through the simple protocol (no arguments), and the server answers
	// an empty query at once. (Failing the hook on purpose would save that
	// round trip, but every query tracer and database/sql instrumentation
	// would count an error per call.)
	noStatement = `-- pgbox`
)
