package testutil

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/testdb"
)

// Role is a login role of a test's own, for tests that take privileges away
// from a component while it runs (a revoked grant). Roles are global to the
// server, so each is named after the test's schema and dropped at cleanup.
type Role struct {
	// Name is the role's name.
	Name string
	// URL connects as the role, with search_path set to the test's schema.
	URL string

	db *testdb.DB
}

// NewRole creates a LOGIN role that may use every table, sequence and
// function of db's schema (Grant), and drops it when the test ends. It
// needs a server that lets the test's user create roles and authenticates
// loopback connections without a password (the test cluster's trust setup).
func NewRole(t testing.TB, db *testdb.DB) *Role {
	t.Helper()
	name := "r_" + db.Schema
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("testutil: parse the schema URL: %v", err)
	}
	u.User = url.User(name)
	r := &Role{Name: name, URL: u.String(), db: db}
	r.exec(t, "CREATE ROLE "+r.ident()+" LOGIN")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		for _, q := range []string{"DROP OWNED BY " + r.ident(), "DROP ROLE " + r.ident()} {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				t.Logf("testutil: %s: %v", q, err)
			}
		}
	})
	r.Grant(t)
	return r
}

// Grant gives the role what a pgbox component needs in the schema.
func (r *Role) Grant(t testing.TB) {
	t.Helper()
	s, n := pgx.Identifier{r.db.Schema}.Sanitize(), r.ident()
	r.exec(t, "GRANT USAGE ON SCHEMA "+s+" TO "+n)
	r.exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+s+" TO "+n)
	r.exec(t, "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA "+s+" TO "+n)
}

// Revoke takes the role's privileges on the schema's tables and sequences
// away, as an operator's mistaken REVOKE would.
func (r *Role) Revoke(t testing.TB) {
	t.Helper()
	s, n := pgx.Identifier{r.db.Schema}.Sanitize(), r.ident()
	r.exec(t, "REVOKE ALL ON ALL TABLES IN SCHEMA "+s+" FROM "+n)
	r.exec(t, "REVOKE ALL ON ALL SEQUENCES IN SCHEMA "+s+" FROM "+n)
}

func (r *Role) ident() string { return pgx.Identifier{r.Name}.Sanitize() }

func (r *Role) exec(t testing.TB, q string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.db.Pool.Exec(ctx, q); err != nil {
		t.Fatalf("testutil: %s: %v", q, err)
	}
}
