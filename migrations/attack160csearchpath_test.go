package migrations_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
)

// twoPgboxes is a fresh database with pgbox migrated under the default
// search_path ("$user",public: into public), then a second pgbox in a
// schema named after the migrating role (rs, quoted): open opens the
// database with a search_path, def is the default path's.
func twoPgboxes(t *testing.T) (open func(path string) *sql.DB, def *sql.DB, role, rs string) {
	t.Helper()
	ctx := context.Background()
	_, u := testdb.CreateDatabase(t, "t_db_")
	open = func(path string) *sql.DB { return openSearchPath(t, u, path) }
	def = open(`"$user",public`)
	require.NoError(t, def.QueryRowContext(ctx, `SELECT current_user`).Scan(&role))
	require.NoError(t, migrations.Up(ctx, def), "default search_path: pgbox goes to public")
	rs = pgx.Identifier{role}.Sanitize()
	_, err := def.ExecContext(ctx, `CREATE SCHEMA `+rs)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, open(rs)))
	return open, def, role, rs
}

// SET search_path FROM CURRENT captures the migration session's
// search_path as written, not the schema the migration created its
// tables in. Migrated with PostgreSQL's default search_path ("$user",
// public) and no schema named after the role, pgbox goes to public and
// pgbox_outbox_rewind() keeps "$user", public: "$user" is resolved at
// each call (the function is not SECURITY DEFINER: the caller's role).
// Once a schema named after the role exists holding another pgbox (a
// target migrated with --schema <role>, PostgreSQL's own recommended
// schema-per-user pattern), a retry of a parked row of public's outbox
// writes its rewind into that schema's table: public's relays never see
// it (the held rows wait for the sweep, counted below a floor), the other
// schema's relays rescan for nothing. The case f621cc3 set out to fix
// (attack160b's), through the captured path. FAILS on f621cc3; PASSES on
// 6b5bbfe (no SET: the session's path, public, was followed). (00120's
// pgbox_outbox_fill_slot and pgbox_outbox_xid_first capture the same
// path; SECURITY DEFINER makes their "$user" the owner's: same schema.)
// A fix: set the function's search_path to the migration's
// current_schema() (quoted), e.g. EXECUTE format('ALTER FUNCTION
// pgbox_outbox_rewind() SET search_path = %I, pg_temp', current_schema()).
func TestAttack160cRewindSearchPathCapturesUserSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open, def, role, rs := twoPgboxes(t)
	var cfg string
	require.NoError(t, def.QueryRowContext(ctx, `SELECT coalesce(array_to_string(proconfig, ','), '') FROM pg_proc WHERE oid = 'public.pgbox_outbox_rewind()'::regprocedure`).Scan(&cfg))
	t.Logf("public.pgbox_outbox_rewind() proconfig: %s", cfg)

	pub := open("public")
	var id int64
	require.NoError(t, pub.QueryRowContext(ctx, `INSERT INTO public.pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'k', 'v', now()) RETURNING id`).Scan(&id))
	_, err := pub.ExecContext(ctx, `UPDATE public.pgbox_outbox SET parked_at = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	var inPublic, inRole int
	require.NoError(t, pub.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM public.pgbox_outbox_rewinds), (SELECT count(*) FROM `+rs+`.pgbox_outbox_rewinds)`).Scan(&inPublic, &inRole))
	require.True(t, inPublic >= 1 && inRole == 0,
		"retry of public's parked row from a session whose search_path is public: rewinds in public: %d, in %s: %d (function's search_path: %s)",
		inPublic, role, inRole, cfg)
}

// The same captured path in 00120's pgbox_outbox_xid_first and
// pgbox_outbox_fill_slot (SECURITY DEFINER: "$user" is the owner, here
// the migrating role, whose schema now holds another pgbox): every INSERT
// into public's outbox reads the other schema's sequence and marker
// (pgbox.outbox_id_seen), and a row whose id is not above that value is
// given an id from the other schema's sequence. Not f621cc3's (00120's),
// found comparing the two. Failed before 00160 pinned the functions' search_path.
func TestAttack160cInsertSearchPathCapturesUserSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open, _, role, rs := twoPgboxes(t)
	other := open(rs)
	_, err := other.ExecContext(ctx, `INSERT INTO pgbox_outbox (topic, key, value) SELECT 't', 'k', 'v' FROM generate_series(1, 1000)`)
	require.NoError(t, err)

	pub := open("public")
	var id int64
	require.NoError(t, pub.QueryRowContext(ctx, `INSERT INTO public.pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'v') RETURNING id`).Scan(&id))
	var last int64
	require.NoError(t, pub.QueryRowContext(ctx, `SELECT last_value FROM public.pgbox_outbox_id_seq`).Scan(&last))
	require.LessOrEqual(t, id, last, "public's row got id %d: above its own sequence's %d (taken from %s's)", id, last, role)
}

// A schema whose name needs quoting (mixed case) as the migration's
// search_path: the pinned search_path keeps the quoted name, and a retry
// from a session whose search_path is public (no pgbox there) writes the
// rewind to that schema (a key change writes none). PASSES.
func TestAttack160cRewindSearchPathQuotedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, u := testdb.CreateDatabase(t, "t_db_")
	open := func(path string) *sql.DB { return openSearchPath(t, u, path) }
	qs := pgx.Identifier{"Tenant_One"}.Sanitize()
	pub := open("public")
	_, err := pub.ExecContext(ctx, `CREATE SCHEMA `+qs)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, open(qs)))
	var id int64
	require.NoError(t, pub.QueryRowContext(ctx, `INSERT INTO `+qs+`.pgbox_outbox (topic, key, value, parked_at) VALUES ('t', 'k', 'v', now()) RETURNING id`).Scan(&id))
	for _, q := range []string{
		`UPDATE ` + qs + `.pgbox_outbox SET key = 'fixed' WHERE id = $1`,
		`UPDATE ` + qs + `.pgbox_outbox SET parked_at = NULL WHERE id = $1`,
	} {
		_, err = pub.ExecContext(ctx, q, id)
		require.NoError(t, err, q)
	}
	var n int
	require.NoError(t, pub.QueryRowContext(ctx, `SELECT count(*) FROM `+qs+`.pgbox_outbox_rewinds WHERE from_id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)
}
