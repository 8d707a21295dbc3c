package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// Write works in every pgx query mode a pooler may call for: behind
// pgbouncer in transaction mode users pick exec or simple_protocol (no named
// prepared statements), where pgx encodes arguments from their Go types
// alone, without a description from the server.
func TestWriteInEveryQueryMode(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgx.ParseConfig(db.URL + "&default_query_exec_mode=" + mode)
			require.NoError(t, err)
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			defer conn.Close(ctx)
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return outbox.Write(ctx, tx,
					outbox.Message{Topic: "modes", Key: []byte(mode), Value: []byte("v"), Headers: []outbox.Header{{Key: "h", Value: []byte{0, 1}}}},
					outbox.Message{Topic: "modes", Key: nil, Value: nil})
			})
			require.NoError(t, err, "outbox.Write in query mode %s", mode)

			// The same through database/sql on a connection in that mode.
			sdb := stdlib.OpenDB(*cfg)
			defer sdb.Close()
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, outbox.WriteSQL(ctx, tx, outbox.Message{Topic: "modes", Key: []byte(mode), Value: []byte("sql")}),
				"outbox.WriteSQL in query mode %s", mode)
			require.NoError(t, tx.Commit())

			var n int
			require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox WHERE key = $1::bytea`, []byte(mode)).Scan(&n))
			require.Equal(t, 2, n)
		})
	}
}
