package migrations_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// Migration 00170: the writers' trigger counts each move forward of a
// reset sequence, and the claim resets its floors when the count changed.

// claimMeta is the first row of a claim: what it says of the sequence.
type claimMeta struct {
	floor   int64
	seqLast *int64
	ident   string
	reset   bool
	ids     []int64
}

// seqResetSchema is a migrated schema whose 16 lanes instance "x" holds,
// with a marker recording seq_hw hw and the sequence at last.
func seqResetSchema(t *testing.T, hw, last int64) *testdb.DB {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_lanes (lane, lanes, owner, expires_at, epoch)
		SELECT g, 16, 'x', now() + interval '1 hour', 7 FROM generate_series(0, 15) g`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_relay_marker (seq_hw) VALUES ($1)`, hw)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', $1)`, last)
	require.NoError(t, err)
	return db
}

// claimAt claims every slot from floor on conn as instance "x" with
// the ident and sequence value the relay saw last.
func claimAt(t *testing.T, conn interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, floor int64, ident string, seqSeen int64) claimMeta {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT id, floor, seq_last, ident, reset FROM pgbox_outbox_claim2('x', 16,
		(SELECT array_agg(g) FROM generate_series(0, 255) g), array_fill($1::bigint, ARRAY[256]), array_fill(7::bigint, ARRAY[256]),
		$2, $3, 0, 0, '{}', false, 100, 1000)`, floor, ident, seqSeen)
	require.NoError(t, err)
	defer rows.Close()
	var m claimMeta
	first := true
	for rows.Next() {
		var id, fl, last *int64
		var id2 *string
		var reset *bool
		require.NoError(t, rows.Scan(&id, &fl, &last, &id2, &reset))
		switch {
		case id != nil:
			m.ids = append(m.ids, *id)
		case first:
			first = false
			m.floor, m.seqLast, m.ident, m.reset = *fl, last, *id2, *reset
		default:
			require.Equal(t, m.floor, *fl, "every slot starts at the same floor")
		}
	}
	require.NoError(t, rows.Err())
	return m
}

func resetsCount(t *testing.T, db *testdb.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT pgbox_outbox_seq_resets()`).Scan(&n))
	return n
}

// Writers count a move forward once however many find the sequence set
// back at once, and never otherwise.
func TestSeqResetCountedOncePerMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := seqResetSchema(t, 1000, 1010)
	insert := `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'v') RETURNING id`
	for range 5 {
		_, err := db.Pool.Exec(ctx, insert)
		require.NoError(t, err)
	}
	require.Zero(t, resetsCount(t, db), "no move, no count")

	_, err := db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	ids := make([]int64, 8)
	for i := range ids {
		wg.Go(func() {
			if err := db.Pool.QueryRow(ctx, insert).Scan(&ids[i]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, resetsCount(t, db), "one move forward, counted once")
	for _, id := range ids {
		require.Greater(t, id, int64(1000), "no id at or below seq_hw again")
	}
	_, err = db.Pool.Exec(ctx, insert)
	require.NoError(t, err)
	require.EqualValues(t, 1, resetsCount(t, db))
}

// A claim whose relay established its floors under the previous count
// starts every slot at 0 and is told to forget them.
func TestSeqResetCountedResetsTheNextClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := seqResetSchema(t, 1000, 1010)
	before := claimAt(t, db.Pool, 0, "", 0)
	require.NotNil(t, before.seqLast)
	steady := claimAt(t, db.Pool, 1005, before.ident, *before.seqLast)
	require.False(t, steady.reset, "nothing changed")
	require.EqualValues(t, 1005, steady.floor)

	_, err := db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'v')`)
	require.NoError(t, err)
	// The sequence is now above what the relay saw: only the count says
	// it went back.
	after := claimAt(t, db.Pool, 1005, before.ident, *before.seqLast)
	require.True(t, after.reset, "the count changed")
	require.Zero(t, after.floor, "every slot from its start")
	require.NotEqual(t, before.ident, after.ident)
	require.True(t, strings.HasSuffix(after.ident, ":1"), "the count is in the ident: %s", after.ident)
	again := claimAt(t, db.Pool, 1005, after.ident, *after.seqLast)
	require.False(t, again.reset, "one reset per move")
}

// The count moves between the claim's first read of it and the statement
// that reads the rows (here the claim waits on the marker row, which a
// session holds): that statement starts every slot at 0, returns the row
// written after the reset, takes no sequence sample, and names the new
// count.
func TestSeqResetCountedInTheRowsStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := seqResetSchema(t, 1000, 1010)
	before := claimAt(t, db.Pool, 0, "", 0)
	_, err := db.Pool.Exec(ctx, `SELECT nextval('pgbox_outbox_id_seq') FROM generate_series(1, 500)`)
	require.NoError(t, err)

	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	var holderPID int32
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_backend_pid() FROM pgbox_relay_marker FOR UPDATE`).Scan(&holderPID))
	got := make(chan claimMeta, 1)
	go func() { got <- claimAt(t, db.Pool, 1005, before.ident, *before.seqLast) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`,
			holderPID).Scan(&n))
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the claim never waited on the marker row")
		time.Sleep(10 * time.Millisecond)
	}
	_, err = db.Pool.Exec(ctx, `SELECT setval('pgbox_outbox_id_seq', 5)`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k', 'v') RETURNING id`).Scan(&id))
	require.EqualValues(t, 1001, id, "moved forward to the seq_hw the writer read")
	require.NoError(t, holder.Commit(ctx))

	m := <-got
	require.True(t, m.reset)
	require.Zero(t, m.floor, "every slot from its start, in the statement that reads the rows")
	require.Nil(t, m.seqLast, "no sample from a sequence read that may be from before the reset")
	require.True(t, strings.HasSuffix(m.ident, ":1"), "the new count: %s", m.ident)
	require.Equal(t, []int64{id}, m.ids, "the row written after the reset is claimed")
	var hw int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT seq_hw FROM pgbox_relay_marker`).Scan(&hw))
	require.EqualValues(t, 1510, hw, "the claim raised seq_hw to what it read before the reset")
}
