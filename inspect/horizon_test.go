package inspect_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
)

// everyHolder lists all the holders: the shared test server has other
// tests' sessions, some older than ours.
var everyHolder = inspect.Config{HorizonList: 100000}

func suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// holder is one connection that holds the horizon, under an application_name
// of its own.
type holder struct {
	conn *pgx.Conn
	pid  int
	app  string
}

// connectAs opens a connection to rawURL as application app (and as user,
// when not empty), closed at cleanup.
func connectAs(t *testing.T, rawURL, user, app string) *holder {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	if user != "" {
		u.User = url.User(user)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	h := &holder{conn: conn, app: app}
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&h.pid))
	return h
}

func (h *holder) exec(t *testing.T, sql string) {
	t.Helper()
	_, err := h.conn.Exec(context.Background(), sql)
	require.NoError(t, err)
}

// find returns the listed holder with pid.
func find(t *testing.T, h inspect.Horizon, pid int) inspect.HorizonHolder {
	t.Helper()
	for _, x := range h.Holders {
		if x.PID == pid {
			return x
		}
	}
	require.Failf(t, "holder not listed", "pid %d is not among %d holders", pid, len(h.Holders))
	return inspect.HorizonHolder{}
}

func listed(h inspect.Horizon, pid int) bool {
	for _, x := range h.Holders {
		if x.PID == pid {
			return true
		}
	}
	return false
}

func kind(h inspect.Horizon, k inspect.HolderKind) (inspect.HorizonKind, bool) {
	for _, x := range h.Kinds {
		if x.Kind == k {
			return x, true
		}
	}
	return inspect.HorizonKind{}, false
}

// TestHorizonHolders: a REPEATABLE READ transaction that has read and an
// idle-in-transaction session that wrote each hold the horizon; the
// snapshot names them (pid, application, state, query, transaction start)
// with a positive age, and forgets them once they end.
func TestHorizonHolders(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	outboxRows(t, db, "orders", 0, 1, 0)

	rr := connectAs(t, db.URL, "", "horizon-rr-"+suffix())
	rr.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	rr.exec(t, `SELECT count(*) FROM pgbox_outbox`)
	wr := connectAs(t, db.URL, "", "horizon-writer-"+suffix())
	wr.exec(t, `BEGIN`)
	var xid uint64
	require.NoError(t, wr.conn.QueryRow(ctx, `UPDATE pgbox_outbox SET attempts = attempts + 1 RETURNING pg_current_xact_id()::text::bigint`).Scan(&xid))
	_, err := db.Pool.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	snap, err := inspect.Read(ctx, db.Pool, everyHolder)
	require.NoError(t, err)
	h := snap.Horizon
	for _, c := range []*holder{rr, wr} {
		x := find(t, h, c.pid)
		require.Equal(t, inspect.HolderSession, x.Kind)
		require.Equal(t, c.app, x.Application)
		require.Equal(t, "idle in transaction", x.State)
		require.Equal(t, "pgbox", x.Database)
		require.False(t, x.Hidden)
		require.NotNil(t, x.XactStart)
		require.NotNil(t, x.AgeSeconds)
		require.Positive(t, *x.AgeSeconds)
		require.GreaterOrEqual(t, x.AgeTransactions, int64(1))
		require.GreaterOrEqual(t, *h.AgeSeconds, *x.AgeSeconds, "the horizon is at least as old as each holder")
		require.GreaterOrEqual(t, h.AgeTransactions, x.AgeTransactions)
	}
	require.Contains(t, find(t, h, rr.pid).Query, "pgbox_outbox")
	// A session that wrote holds its own xid, or its snapshot's older xmin.
	require.GreaterOrEqual(t, int32(uint32(xid)-find(t, h, wr.pid).Xmin), int32(0), "the writer holds at or below its xid")
	k, ok := kind(h, inspect.HolderSession)
	require.True(t, ok)
	require.GreaterOrEqual(t, k.Holders, 2)

	var text strings.Builder
	snap.WriteText(&text)
	require.Contains(t, text.String(), "XMIN HORIZON: held")
	require.Contains(t, text.String(), rr.app)
	require.Contains(t, text.String(), wr.app)

	rr.exec(t, `COMMIT`)
	wr.exec(t, `ROLLBACK`)
	snap, err = inspect.Read(ctx, db.Pool, everyHolder)
	require.NoError(t, err)
	require.False(t, listed(snap.Horizon, rr.pid), "a committed transaction holds nothing")
	require.False(t, listed(snap.Horizon, wr.pid), "a rolled-back transaction holds nothing")

	// The list stops at HorizonList; the ages and kinds still count every holder.
	rr.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	rr.exec(t, `SELECT 1`)
	defer rr.exec(t, `ROLLBACK`)
	snap, err = inspect.Read(ctx, db.Pool, inspect.Config{HorizonList: 1})
	require.NoError(t, err)
	require.Len(t, snap.Horizon.Holders, 1)
	k, ok = kind(snap.Horizon, inspect.HolderSession)
	require.True(t, ok)
	require.Equal(t, k.Holders, len(snap.Horizon.Holders)+snap.Horizon.More-otherKinds(snap.Horizon))
}

// otherKinds counts the holders that are not sessions.
func otherKinds(h inspect.Horizon) int {
	n := 0
	for _, k := range h.Kinds {
		if k.Kind != inspect.HolderSession {
			n += k.Holders
		}
	}
	return n
}

// TestHorizonAsUnprivilegedRole: a role without superuser or
// pg_read_all_stats reads the snapshot; another role's holder is listed with
// its pid, application and age in transactions, its state, times and query
// hidden (and marked so); the role's own holder is shown in full.
func TestHorizonAsUnprivilegedRole(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	role := "pgbox_horizon_" + suffix()
	ident := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	exec(t, db, `CREATE ROLE `+ident+` LOGIN NOSUPERUSER`)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = db.Pool.Exec(ctx, `DROP OWNED BY `+ident)
		_, err := db.Pool.Exec(ctx, `DROP ROLE `+ident)
		require.NoError(t, err)
	})
	exec(t, db, `GRANT USAGE ON SCHEMA `+schema+` TO `+ident)
	exec(t, db, `GRANT SELECT ON ALL TABLES IN SCHEMA `+schema+` TO `+ident)

	other := connectAs(t, db.URL, "", "horizon-superuser-"+suffix())
	other.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	other.exec(t, `SELECT count(*) FROM pgbox_outbox`)
	own := connectAs(t, db.URL, role, "horizon-own-"+suffix())
	own.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	own.exec(t, `SELECT count(*) FROM pgbox_outbox`)
	_, err := db.Pool.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	var super bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT rolsuper OR pg_has_role('pg_read_all_stats', 'MEMBER') FROM pg_roles WHERE rolname = current_user`).Scan(&super))
	require.False(t, super)

	snap, err := inspect.Read(ctx, pool, everyHolder)
	require.NoError(t, err)
	x := find(t, snap.Horizon, other.pid)
	require.True(t, x.Hidden)
	require.Equal(t, other.app, x.Application)
	require.Equal(t, "pgbox", x.User)
	require.Empty(t, x.State)
	require.Empty(t, x.Query)
	require.Nil(t, x.XactStart)
	require.Nil(t, x.AgeSeconds)
	require.GreaterOrEqual(t, x.AgeTransactions, int64(1))

	x = find(t, snap.Horizon, own.pid)
	require.False(t, x.Hidden)
	require.Equal(t, "idle in transaction", x.State)
	require.NotNil(t, x.AgeSeconds)
	require.Positive(t, *x.AgeSeconds)

	var text strings.Builder
	snap.WriteText(&text)
	require.Contains(t, text.String(), "(hidden: grant pg_read_all_stats)")
	own.exec(t, `ROLLBACK`)
	other.exec(t, `ROLLBACK`)
}

// TestHorizonSummaryBounds: the summary marks a horizon held past
// HorizonWarnAge or HorizonWarnTransactions, and only then.
func TestHorizonSummaryBounds(t *testing.T) {
	t.Parallel()
	age := func(d time.Duration) *float64 { s := d.Seconds(); return &s }
	session := inspect.HorizonHolder{Kind: inspect.HolderSession, PID: 42, Application: "pg_dump", State: "active"}
	for _, c := range []struct {
		h    inspect.Horizon
		over bool
	}{
		{inspect.Horizon{}, false},
		{inspect.Horizon{AgeSeconds: age(inspect.HorizonWarnAge), AgeTransactions: 10, Holders: []inspect.HorizonHolder{session}}, false},
		{inspect.Horizon{AgeSeconds: age(inspect.HorizonWarnAge + time.Second), AgeTransactions: 10, Holders: []inspect.HorizonHolder{session}}, true},
		{inspect.Horizon{AgeTransactions: inspect.HorizonWarnTransactions + 1, Holders: []inspect.HorizonHolder{{Kind: inspect.HolderSlot, Name: "standby1"}}}, true},
		// A logical slot's catalog_xmin holds only the catalogs.
		{inspect.Horizon{Holders: []inspect.HorizonHolder{{Kind: inspect.HolderSlotCatalog, Name: "cdc", AgeTransactions: 2 * inspect.HorizonWarnTransactions}}}, false},
	} {
		require.Equal(t, c.over, c.h.Over(), "%+v", c.h)
		require.Equal(t, c.over, strings.Contains(c.h.Summary(), "past the bound"), c.h.Summary())
	}
	require.Equal(t, "held 10m1s, 10 transactions; oldest horizon: session pid 42 (pg_dump, active) - past the bound (10m or 1000000 transactions): VACUUM cannot remove the rows deleted since; see docs/operations.md, \"A held xmin horizon\"",
		inspect.Horizon{AgeSeconds: age(inspect.HorizonWarnAge + time.Second), AgeTransactions: 10, Holders: []inspect.HorizonHolder{session}}.Summary())
	require.Contains(t, inspect.Horizon{}.Summary(), "not held")
}

// ReadHorizon reads what Read puts in Snapshot.Horizon, and a snapshot
// given Config.Horizon takes it as it is instead of reading it again (a
// fleet's reader reads a database's horizon once for its schemas): here a
// horizon no database could give, kept whole, while the holder the server
// shows is not read.
func TestReadHorizonShared(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	rr := connectAs(t, db.URL, "", "horizon-shared-"+suffix())
	rr.exec(t, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	rr.exec(t, `SELECT count(*) FROM pgbox_outbox`)

	h, err := inspect.ReadHorizon(ctx, db.Pool, everyHolder)
	require.NoError(t, err)
	require.Equal(t, inspect.HolderSession, find(t, h, rr.pid).Kind)
	snap, err := inspect.Read(ctx, db.Pool, everyHolder)
	require.NoError(t, err)
	require.Equal(t, inspect.HolderSession, find(t, snap.Horizon, rr.pid).Kind, "Read lists the same holder")

	age := 12345.0
	given := inspect.Horizon{AgeSeconds: &age, AgeTransactions: 777,
		Kinds:   []inspect.HorizonKind{{Kind: inspect.HolderPrepared, Holders: 1, AgeTransactions: 777, AgeSeconds: &age}},
		Holders: []inspect.HorizonHolder{{Kind: inspect.HolderPrepared, Name: "given", AgeTransactions: 777, AgeSeconds: &age}}}
	cfg := everyHolder
	cfg.Horizon = &given
	snap, err = inspect.Read(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, given, snap.Horizon, "the given horizon, not a read one")
	snap.Horizon.Holders[0].Name = "changed"
	require.Equal(t, "given", given.Holders[0].Name, "the snapshot has its own copy")

	_, err = inspect.ReadHorizon(ctx, nil, inspect.Config{})
	require.Error(t, err)
}
