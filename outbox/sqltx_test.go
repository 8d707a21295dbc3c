package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// WriteSQL refuses a *sql.Tx it cannot write through, with an error saying
// what is needed, before anything is sent: one from another driver (strict
// about argument types, or taking any), one already committed or rolled
// back, one whose connection left its transaction block (COMMIT run through
// it: the rows would commit on their own, outside the business transaction).
func TestWriteSQLRefusesUnusableTx(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	ok := outbox.Message{Topic: "payments.v1", Key: []byte("k"), Value: []byte("v")}
	check := func(name string, tx *sql.Tx, want string) {
		t.Helper()
		err := outbox.WriteSQL(ctx, tx, ok)
		require.ErrorIs(t, err, outbox.ErrUnsupportedTx, name)
		require.ErrorContains(t, err, "pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib", name)
		require.ErrorContains(t, err, want, name)
	}

	for _, acceptAny := range []bool{false, true} {
		d := &testdb.NotPgx{AcceptAny: acceptAny}
		tx, err := d.Open(t).BeginTx(ctx, nil)
		require.NoError(t, err)
		if acceptAny {
			check("driver taking any argument", tx, "its driver ran the statement without handing it to pgx")
			require.Equal(t, []string{"BEGIN", "SELECT $1::text WHERE false"}, d.Sent(), "only the harmless probe")
		} else {
			check("strict driver", tx, "is not on pgx's database/sql driver")
			require.Equal(t, []string{"BEGIN"}, d.Sent(), "nothing sent")
		}
		require.NoError(t, tx.Rollback())
	}

	sdb, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	defer sdb.Close()
	done, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, done.Commit())
	check("committed", done, "already committed or rolled back")

	left, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = left.ExecContext(ctx, `COMMIT`)
	require.NoError(t, err)
	check("left its transaction block", left, "not in a transaction block")
	require.NoError(t, left.Rollback())

	require.Empty(t, readRows(t, db), "nothing written")
}
