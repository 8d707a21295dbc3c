package testdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"testing"
)

// NotPgx is a database/sql driver that is not pgx's, for the tests of
// inbox.ProcessSQL and outbox.WriteSQL refusing its transactions. It talks to
// no server: it records the statements it is asked to run and runs none.
// With AcceptAny, its connections take arguments of any type
// (driver.NamedValueChecker returning nil, as some drivers do); otherwise
// database/sql converts arguments with its default rules, as for lib/pq.
type NotPgx struct {
	AcceptAny bool

	mu   sync.Mutex
	sent []string
}

// Open returns a *sql.DB on the driver, closed at cleanup.
func (d *NotPgx) Open(t testing.TB) *sql.DB {
	t.Helper()
	db := sql.OpenDB(d)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Sent returns the statements the driver was asked to run.
func (d *NotPgx) Sent() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.sent...)
}

// Connect implements driver.Connector.
func (d *NotPgx) Connect(context.Context) (driver.Conn, error) {
	c := &notPgxConn{d: d}
	if d.AcceptAny {
		return &acceptAnyConn{c}, nil
	}
	return c, nil
}

// Driver implements driver.Connector.
func (d *NotPgx) Driver() driver.Driver { return notPgxDriver{} }

type notPgxDriver struct{}

func (notPgxDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("testdb.NotPgx: use sql.OpenDB")
}

type notPgxConn struct{ d *NotPgx }

func (c *notPgxConn) record(q string) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.sent = append(c.d.sent, q)
}

func (c *notPgxConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("testdb.NotPgx: no prepared statements")
}
func (c *notPgxConn) Close() error { return nil }
func (c *notPgxConn) Begin() (driver.Tx, error) {
	c.record("BEGIN")
	return notPgxTx{c}, nil
}

func (c *notPgxConn) ExecContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Result, error) {
	c.record(q)
	return driver.RowsAffected(0), nil
}

func (c *notPgxConn) QueryContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Rows, error) {
	c.record(q)
	return noRows{}, nil
}

type acceptAnyConn struct{ *notPgxConn }

func (*acceptAnyConn) CheckNamedValue(*driver.NamedValue) error { return nil }

type notPgxTx struct{ c *notPgxConn }

func (t notPgxTx) Commit() error   { t.c.record("COMMIT"); return nil }
func (t notPgxTx) Rollback() error { t.c.record("ROLLBACK"); return nil }

type noRows struct{}

func (noRows) Columns() []string         { return nil }
func (noRows) Close() error              { return nil }
func (noRows) Next([]driver.Value) error { return io.EOF }

// UnusableTx is a *sql.Tx that pgbox's database/sql entry points
// (inbox.ProcessSQL, outbox.WriteSQL...) must refuse before sending
// anything of their own.
type UnusableTx struct {
	Name string
	Tx   *sql.Tx
	// Want is what the refusal's error says about it.
	Want string
	// Driver is the foreign driver the transaction is on, for the
	// statements it saw; nil for pgx's own.
	Driver *NotPgx
}

// UnusableTxs begins one of each *sql.Tx that cannot be written through: on
// a foreign driver strict about argument types, on one taking any argument,
// on pgx's driver but already committed, and on pgx's driver but whose
// connection left its transaction block (COMMIT run through it: a write
// there would commit on its own). The transactions still open are rolled
// back when the test ends.
func UnusableTxs(t testing.TB, db *DB) []UnusableTx {
	t.Helper()
	ctx := context.Background()
	begin := func(s *sql.DB) *sql.Tx {
		t.Helper()
		tx, err := s.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("testdb: begin: %v", err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		return tx
	}
	strict, acceptAny := &NotPgx{}, &NotPgx{AcceptAny: true}
	s := db.SQL(t)
	done := begin(s)
	if err := done.Commit(); err != nil {
		t.Fatalf("testdb: commit: %v", err)
	}
	left := begin(s)
	if _, err := left.ExecContext(ctx, `COMMIT`); err != nil {
		t.Fatalf("testdb: COMMIT through the transaction: %v", err)
	}
	return []UnusableTx{
		{Name: "strict driver", Tx: begin(strict.Open(t)), Want: "is not on pgx's database/sql driver", Driver: strict},
		{Name: "driver taking any argument", Tx: begin(acceptAny.Open(t)), Want: "its driver ran the statement without handing it to pgx", Driver: acceptAny},
		{Name: "committed", Tx: done, Want: "already committed or rolled back"},
		{Name: "left its transaction block", Tx: left, Want: "not in a transaction block"},
	}
}
