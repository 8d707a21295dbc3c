package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// questionRig is one pool's connection and the schemas its questions ask.
type questionRig struct {
	pool     *pgxpool.Pool
	pc       *pgconn.PgConn
	empty    *testdb.DB
	rows     *testdb.DB
	prepared map[string]string
}

func newQuestionRig(t *testing.T) *questionRig {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	g := &questionRig{pool: pool, empty: testdb.New(t), rows: testdb.New(t), prepared: map[string]string{}}
	require.NoError(t, pgx.BeginFunc(ctx, g.rows.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "w", Value: []byte("x")})
	}))
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(c.Release)
	g.pc = c.Conn().PgConn()
	return g
}

// relays are n relays asking about the empty schema, but at the indexes of
// at: the schema given there. They watch, with their floor at 0.
func (g *questionRig) relays(n int, at map[int]string) []*Relay {
	rs := make([]*Relay, n)
	for i := range rs {
		schema, ok := at[i]
		if !ok {
			schema = g.empty.Schema
		}
		rs[i] = &Relay{cfg: Config{Schema: schema}, wake: make(chan struct{}, 1), shared: &sharedWatch{kick: make(chan struct{}, 1)}}
		rs[i].shared.on.Store(true)
	}
	return rs
}

// woken takes each relay's wake-up: the indexes woken.
func wokenOf(rs []*Relay) []int {
	var out []int
	for i, r := range rs {
		select {
		case <-r.wake:
			out = append(out, i)
		default:
		}
	}
	return out
}

// One target's failing question in the middle of a group (its schema
// missing, its table locked past lock_timeout) fails that question only:
// the rest of its group are asked again and answered, the targets with rows
// after it are woken, the empty ones are not. The failed target is then
// asked alone until its question is answered. Both the idle poll and the
// busy targets' watch ask so.
func TestQuestionsFailAloneInAGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	missing := "pgbox_no_such_schema_" + fmt.Sprint(time.Now().UnixNano())
	locked := testdb.New(t)
	for _, tc := range []struct {
		name     string
		pipeline func(context.Context, *pgconn.PgConn, map[string]string, []*Relay) error
	}{{"idle", pollPipeline}, {"watch", watchPipeline}} {
		// 70 questions: groups 0-31, 32-63, 64-69. A missing schema at 3
		// and a locked table at 40, rows at 4, 31 (after the failure, same
		// group), 41 and 69.
		at := map[int]string{3: missing, 40: locked.Schema, 4: g.rows.Schema, 31: g.rows.Schema, 41: g.rows.Schema, 69: g.rows.Schema}
		rs := g.relays(70, at)

		lockTx, err := locked.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = lockTx.Exec(ctx, `LOCK TABLE pgbox_outbox IN ACCESS EXCLUSIVE MODE`)
		require.NoError(t, err)
		require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
		require.NoError(t, lockTx.Rollback(ctx))
		require.Equal(t, []int{3, 4, 31, 40, 41, 69}, wokenOf(rs), "%s: the failed ones and the ones with rows woken, no empty one", tc.name)
		for i, r := range rs {
			require.Equal(t, i == 3 || i == 40, r.askAlone.Load(), "%s: relay %d asked alone next", tc.name, i)
		}
		alone := make([]bool, len(rs))
		for i, r := range rs {
			alone[i] = r.askAlone.Load()
		}
		est := make([]time.Duration, len(rs))
		for i := range est {
			est[i] = time.Millisecond
		}
		groups := groupQuestions(alone, est, []int{0, 1, 2, 3, 4, 5, 40, 41})
		require.Equal(t, [][]int{{3}, {40}, {0, 1, 2, 4, 5, 41}}, groups, "%s: the failed ones in groups of their own", tc.name)
		est[1], est[2] = 10*time.Millisecond, 9*time.Millisecond
		require.Equal(t, [][]int{{3}, {0, 1, 2}, {40}, {4, 5, 41}}, groupQuestions(alone, est, []int{0, 1, 2, 3, 4, 5, 40, 41}),
			"%s: a group closed at groupBudget by its answers' last times", tc.name)

		// Next round: the lock gone, the locked target is answered and
		// joins the groups again; the missing one fails alone again.
		require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
		require.Equal(t, []int{3, 4, 31, 41, 69}, wokenOf(rs), tc.name)
		for i, r := range rs {
			require.Equal(t, i == 3, r.askAlone.Load(), "%s: relay %d asked alone next", tc.name, i)
		}
	}
	// Every schema's question is prepared once on the connection, the ones
	// answered before a failure of their group included; the missing
	// schema's prepare failed and is not recorded.
	require.Len(t, g.prepared, 6, "idle and watch questions of empty, rows and locked: %v", g.prepared)
	for key, name := range g.prepared {
		require.NotContains(t, key, missing)
		res := g.pc.ExecParams(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name = $1`, [][]byte{[]byte(name)}, nil, nil, nil).Read()
		require.NoError(t, res.Err)
		require.Equal(t, "1", string(res.Rows[0][0]), "statement %s (%q) prepared on the connection", name, key)
	}
}

// Each question of a group reports the server's time on it alone: a slow
// question (its outbox a view over pg_sleep) does not make the ones after
// it in its transaction look slow, which would keep their targets from
// going dormant (pollPipeline's slow verdict).
func TestQuestionsTookIsEachQuestions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	slow := testdb.Empty(t)
	_, err := slow.Pool.Exec(ctx, `CREATE VIEW pgbox_outbox AS SELECT NULL::timestamptz AS parked_at, NULL::bytea AS key,
		'w'::text AS topic, 1::bigint AS id, 0::int AS slot FROM pg_sleep(0.3)`)
	require.NoError(t, err)
	rs := g.relays(8, map[int]string{2: slow.Schema})
	took := make([]time.Duration, len(rs))
	errs, err := askGrouped(ctx, g.pc, rs, func(p *pgconn.Pipeline, i int) {
		p.SendQueryParams(idleQuestion(rs[i].cfg.Schema), nil, nil, nil, nil)
	}, func(p *pgconn.Pipeline, i int) (err error) {
		_, took[i], err = pollResult(p)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, make([]error, len(rs)), errs)
	t.Logf("took: %v", took)
	require.GreaterOrEqual(t, took[2], 300*time.Millisecond, "the slow question")
	for i, d := range took {
		if i != 2 {
			require.Less(t, d, 100*time.Millisecond, "question %d after or before the slow one", i)
		}
	}
}

// A group runs READ COMMITTED whatever the session's default, so each of
// its questions reads in a snapshot of its own (a repeatable read default
// gave a group one snapshot: TestQuestionsAttackGroupSnapshotUnderRepeatableRead,
// which the group's statement_timeout also covers now).
func TestQuestionsGroupIsReadCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	_, err := g.pc.Exec(ctx, `SET default_transaction_isolation = 'repeatable read'`).ReadAll()
	require.NoError(t, err)
	rs := g.relays(3, nil)
	got := make([]string, len(rs))
	errs, err := askGrouped(ctx, g.pc, rs, func(p *pgconn.Pipeline, i int) {
		p.SendQueryParams(`SELECT current_setting('transaction_isolation')`, nil, nil, nil, nil)
	}, func(p *pgconn.Pipeline, i int) error {
		res, err := p.GetResults()
		if err != nil {
			return err
		}
		rr := res.(*pgconn.ResultReader)
		for rr.NextRow() {
			got[i] = string(rr.Values()[0])
		}
		_, err = rr.Close()
		return err
	})
	require.NoError(t, err)
	require.Equal(t, make([]error, len(rs)), errs)
	require.Equal(t, []string{"read committed", "read committed", "read committed"}, got)
}
