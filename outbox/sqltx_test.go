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

	for _, u := range testdb.UnusableTxs(t, db) {
		check(u.Name, u.Tx, u.Want)
		switch {
		case u.Driver == nil:
		case u.Driver.AcceptAny:
			require.Equal(t, []string{"BEGIN", "SELECT $1::text WHERE false"}, u.Driver.Sent(), "only the harmless probe")
		default:
			require.Equal(t, []string{"BEGIN"}, u.Driver.Sent(), "nothing sent")
		}
	}

	require.Empty(t, readRows(t, db), "nothing written")
}
