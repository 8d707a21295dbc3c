package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// Attacks on 9b8eae6 (the grouped questions' fix: READ COMMITTED groups,
// 2 ms / 20 ms group timeouts, the late question asked again alone). Five
// failed on 9b8eae6 and pass since: a late question stays alone (askGrouped
// keeps askAlone for it), every group runs READ COMMITTED (a question alone
// too), a question skipped or late is asked again alone (sent twice at
// most), and a group is closed at groupBudget by its questions' last
// times. The comments below describe 9b8eae6.

// show reads a setting on the rig's connection.
func (g *questionRig) show(t *testing.T, name string) string {
	t.Helper()
	res := g.pc.ExecParams(context.Background(), `SELECT current_setting($1)`, [][]byte{[]byte(name)}, nil, nil, nil).Read()
	require.NoError(t, res.Err)
	return string(res.Rows[0][0])
}

// The busy watch: a target whose watch question takes 30 ms (dead rows a
// held horizon keeps; here a view over pg_sleep) is canceled at its
// group's 20 ms statement_timeout, asked again alone and answered; then
// askGrouped stores askAlone = false (its error is nil), so the next round
// puts it in a group again: every round it holds its group's earlier
// targets' locks 20 ms, aborts its group, costs a second pipeline, and
// with two such targets in two groups every other question of the round
// is asked alone (size = 1). pollPipeline keeps such a target alone (took
// > emptySlow); watchPipeline has no such verdict.
func TestQuestionsQ2WatchSlowQuestionGroupedEveryRound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.03)
	for _, tc := range questionPipelines {
		rs := g.relays(4, map[int]string{1: slow.Schema})
		for round := 0; round < 3; round++ {
			require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
			require.Contains(t, wokenOf(rs), 1, "%s round %d: the slow view shows a row", tc.name, round)
			require.Equal(t, []int{1}, askAloneOf(rs),
				"%s round %d: the question canceled at its group's 20 ms statement_timeout is put back in a group next round (canceled again every round)", tc.name, round)
		}
	}
}

// The default transaction is SERIALIZABLE READ ONLY DEFERRABLE (ALTER
// ROLE/DATABASE ... SET default_transaction_*: a reporting role). A group
// of more than one runs READ COMMITTED (readCommittedSQL), but a question
// asked alone (questionSetSQL: no isolation, no statement_timeout) starts
// a deferrable serializable transaction: it waits for a safe snapshot, as
// long as any serializable read-write transaction runs on the server (any
// database), and the whole pipeline (every other target of the pool) waits
// with it, to askOn's timeout (the connection closed, every target woken).
// A single dormant target of a pool, a target that failed once, or any
// question after two aborted groups (size = 1) is asked so.
func TestQuestionsQ2AloneQuestionWaitsForSafeSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	other := testdb.New(t)
	holder, err := other.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT count(*) FROM pgbox_outbox`)
	require.NoError(t, err)
	for _, n := range []int{2, 1} { // a group; a question alone
		for _, tc := range questionPipelines {
			c, err := g.pool.Acquire(ctx)
			require.NoError(t, err)
			pc := c.Conn().PgConn()
			_, err = pc.Exec(ctx, `SET default_transaction_isolation = 'serializable'; SET default_transaction_read_only = on; SET default_transaction_deferrable = on`).ReadAll()
			require.NoError(t, err)
			rs := g.relays(n, map[int]string{0: g.rows.Schema})
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			start := time.Now()
			err = tc.pipeline(pctx, pc, map[string]string{}, rs)
			cancel()
			took := time.Since(start)
			_, _ = pc.Exec(ctx, `RESET ALL`).ReadAll()
			c.Release()
			if err != nil {
				t.Errorf("%s, %d question(s): the pipeline failed after %v (waiting for a safe snapshot while a serializable transaction runs elsewhere): %v", tc.name, n, took.Round(time.Millisecond), err)
				continue
			}
			require.Less(t, took, time.Second, "%s, %d question(s)", tc.name, n)
			require.Equal(t, []int{0}, wokenOf(rs), "%s, %d question(s)", tc.name, n)
		}
	}
}

// Nothing the groups or the alone questions set outlives the pipeline:
// after rounds with a late question (canceled at 20 ms, asked again
// alone), a failed question (an aborted group) and plain groups, the
// connection is idle and shows the session's own settings.
func TestQuestionsQ2NoSettingLeaks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.03)
	_, err := g.pc.Exec(ctx, `SET lock_timeout = '7s'; SET statement_timeout = '9s'; SET default_transaction_isolation = 'repeatable read'`).ReadAll()
	require.NoError(t, err)
	missing := "pgbox_no_such_schema_leak_" + fmt.Sprint(time.Now().UnixNano())
	for _, prepared := range []map[string]string{g.prepared, nil} {
		for _, tc := range questionPipelines {
			rs := g.relays(40, map[int]string{3: slow.Schema, 5: missing, 35: slow.Schema, 36: g.rows.Schema})
			for round := 0; round < 2; round++ {
				require.NoError(t, tc.pipeline(ctx, g.pc, prepared, rs), tc.name)
				require.Equal(t, []int{3, 5, 35, 36}, wokenOf(rs), "%s round %d", tc.name, round)
				require.Equal(t, byte('I'), g.pc.TxStatus(), tc.name)
				require.Equal(t, "7s", g.show(t, "lock_timeout"), tc.name)
				require.Equal(t, "9s", g.show(t, "statement_timeout"), tc.name)
				require.Equal(t, "repeatable read", g.show(t, "transaction_isolation"), tc.name)
				require.Equal(t, "on", g.show(t, "enable_seqscan"), tc.name)
				require.Equal(t, "on", g.show(t, "enable_bitmapscan"), tc.name)
			}
		}
	}
}

// deferredFailOutbox is a schema whose pgbox_outbox is a view that shows
// no row but inserts a row breaking a deferred foreign key: the question
// is answered, and its transaction's end (the group's sync) fails.
func deferredFailOutbox(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Empty(t)
	_, err := db.Pool.Exec(context.Background(), `
		CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE child (p int REFERENCES parent DEFERRABLE INITIALLY DEFERRED);
		CREATE FUNCTION bad() RETURNS int LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN INSERT INTO child VALUES (42); RETURN 1; END $$;
		CREATE VIEW pgbox_outbox AS SELECT NULL::timestamptz AS parked_at, NULL::bytea AS key, 'w'::text AS topic,
			1::bigint AS id, 0::int AS slot FROM bad() b WHERE b < 0`)
	require.NoError(t, err)
	return db
}

// The sync-error path: a question answered "no rows" whose group's end
// fails (a deferred constraint at commit): every question of the group
// fails (woken), the sync is read, and the pipeline goes on with the next
// groups in order: their answers are each their own target's (the rows
// targets woken, the empty ones not), and the next round asks the failing
// target alone and the rest in groups, answered.
func TestQuestionsQ2SyncErrorKeepsThePipeline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	bad := deferredFailOutbox(t)
	for _, prepared := range []map[string]string{g.prepared, nil} {
		for _, tc := range questionPipelines {
			rs := g.relays(70, map[int]string{1: g.rows.Schema, 2: bad.Schema, 40: g.rows.Schema, 66: g.rows.Schema})
			for _, r := range rs {
				r.askTook.Store(int64(time.Microsecond)) // quick last answers: groups of 32
			}
			require.NoError(t, tc.pipeline(ctx, g.pc, prepared, rs), tc.name)
			woken := wokenOf(rs)
			for i := 0; i < 32; i++ {
				require.Contains(t, woken, i, "%s: the failed group's question %d", tc.name, i)
			}
			require.Equal(t, []int{40, 66}, woken[32:], "%s: the next groups' answers", tc.name)
			require.Equal(t, byte('I'), g.pc.TxStatus(), tc.name)
			for round := 0; round < 2; round++ {
				require.NoError(t, tc.pipeline(ctx, g.pc, prepared, rs), tc.name)
				require.Equal(t, []int{1, 2, 40, 66}, wokenOf(rs), "%s round %d", tc.name, round)
				require.Equal(t, []int{2}, askAloneOf(rs), "%s round %d", tc.name, round)
			}
		}
	}
}

var _ = pgconn.PipelineSync{}

// askCounted runs askGrouped over rs with the idle question, counting
// each question's sends; rows are the answers, took the call's time.
func askCounted(t *testing.T, g *questionRig, rs []*Relay) (errs []error, sent []int, rows []bool, took time.Duration) {
	t.Helper()
	sent, rows = make([]int, len(rs)), make([]bool, len(rs))
	start := time.Now()
	errs, err := askGrouped(context.Background(), g.pc, rs, func(p *pgconn.Pipeline, i int) {
		sent[i]++
		p.SendQueryParams(idleQuestion(rs[i].cfg.Schema), nil, nil, nil, nil)
	}, func(p *pgconn.Pipeline, i int) (err error) {
		rows[i], _, err = pollResult(p)
		return err
	})
	require.NoError(t, err)
	return errs, sent, rows, time.Since(start)
}

// The size = 1 fallback counts the groups aborted in one pipeline: with
// every question failing in a single group (a pool's ≤ 32 targets, or 33:
// a full group and a failing group of one, which askGrouped does not count
// as aborted), one group aborts per pipeline, never two, so askGrouped
// sends the group again and again, one question shorter each time: the
// last question of n is sent n times, n pipelines in a row (the "70
// failing questions sent 50 times" of 9b8eae6 is fixed for three groups
// only).
func TestQuestionsQ2OneGroupEveryQuestionFails(t *testing.T) {
	t.Parallel()
	g := newQuestionRig(t)
	for _, n := range []int{32, 33} {
		at := map[int]string{}
		for i := 0; i < n; i++ {
			at[i] = fmt.Sprintf("pgbox_no_such_schema_one_%d_%d", i, time.Now().UnixNano())
		}
		rs := g.relays(n, at)
		errs, sent, _, _ := askCounted(t, g, rs)
		for i, err := range errs {
			require.Error(t, err, "question %d", i)
		}
		t.Logf("n=%d: sends %v", n, sent)
		if m := slices.Max(sent); m > 2 {
			t.Errorf("n=%d: the questions of one group sent up to %d times each: %v", n, m, sent)
		}
	}
}

// The same through the group's 20 ms statement_timeout: every target's
// question takes 25 ms (a held horizon: every outbox of the database reads
// dead rows; or a loaded server). In one group, each pipeline cancels the
// first question at 20 ms and asks it again alone, then the rest again as
// a group: n questions take n pipelines and n cancels (question k sent
// k+1 times). In the busy watch askAlone is not kept for them (see
// TestQuestionsQ2WatchSlowQuestionGroupedEveryRound), so this is every
// round.
func TestQuestionsQ2OneGroupEveryQuestionLate(t *testing.T) {
	t.Parallel()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.025)
	const n = 12
	at := map[int]string{}
	for i := 0; i < n; i++ {
		at[i] = slow.Schema
	}
	rs := g.relays(n, at)
	errs, sent, _, took := askCounted(t, g, rs)
	for i, err := range errs {
		require.NoError(t, err, "question %d", i)
	}
	t.Logf("sends %v in %v (%d questions of 25 ms)", sent, took.Round(time.Millisecond), n)
	require.LessOrEqual(t, sent[n-1], 2, "the last of %d late questions of one group sent %d times", n, sent[n-1])
}

// The group's 20 ms statement_timeout bounds each question, not the group:
// a group's locks last the sum of its questions. Here 31 targets answer
// in 9 ms each (a held horizon: every outbox reads dead rows; under
// emptySlow, 10 ms, and under 20 ms: never canceled, never asked alone,
// every round), so target 0's AccessShareLock, taken by the group's first
// question, is held about 280 ms, every round; a DDL of target 0 (100 ms
// lock_timeout) fails. 9b8eae6 promises "a group holds its targets' locks
// 20 ms at most" and "A DDL of a target asked earlier in the group then
// waits 20 ms at most, not for another target's ... slow question".
func TestQuestionsQ2GroupHoldsLocksForTheSumOfItsQuestions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.009)
	for _, tc := range questionPipelines {
		a := testdb.New(t)
		at := map[int]string{0: a.Schema}
		for i := 1; i < questionGroup; i++ {
			at[i] = slow.Schema
		}
		rs := g.relays(questionGroup, at)
		for round := 0; round < 2; round++ {
			done := make(chan error, 1)
			go func() { done <- tc.pipeline(ctx, g.pc, g.prepared, rs) }()
			g.waitSleeping(t, g.pc.PID())
			waited, err := lockOutbox(ctx, a, "100ms")
			require.NoError(t, <-done, tc.name)
			wokenOf(rs)
			require.NoError(t, err, "%s round %d: a DDL of target 0 gave up after %v: its lock held by a group of 9 ms questions (askAlone %v)",
				tc.name, round, waited.Round(time.Millisecond), askAloneOf(rs))
		}
	}
}

// The poll and the watch share relays, each with late questions (canceled
// at 20 ms, asked again alone), failed ones and rows, at once on two
// connections (-race): every round of each returns, every target with rows
// (or slow, or failing) is woken, both connections end idle.
func TestQuestionsQ2PollAndWatchLateAtOnce(t *testing.T) {
	t.Parallel()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.025)
	missing := "pgbox_no_such_schema_q2race_" + fmt.Sprint(time.Now().UnixNano())
	rs := g.relays(70, map[int]string{3: slow.Schema, 7: missing, 8: g.rows.Schema, 40: slow.Schema, 41: g.rows.Schema, 69: missing})
	watch := g.pollAndWatchAtOnce(t, rs, 10)
	require.Equal(t, []int{3, 7, 8, 40, 41, 69}, wokenOf(rs))
	require.Equal(t, byte('I'), g.pc.TxStatus())
	require.Equal(t, byte('I'), watch.TxStatus())
}

// The slow verdict across the re-asks: a 30 ms question is canceled at its
// group's 20 ms in the first round and asked again alone in the same call:
// its took is the alone answer's (not the canceled one's 0), so slowRun
// counts 1, 2, then the slow verdict at slowPolls, and it stays asked
// alone (never canceled again); the others' slowRun stays 0.
func TestQuestionsQ2SlowVerdictAcrossReasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	slow := slowOutbox(t, 0.03)
	rs := g.relays(8, map[int]string{2: slow.Schema})
	for round := 1; round <= slowPolls; round++ {
		require.NoError(t, pollPipeline(ctx, g.pc, g.prepared, rs))
		require.Equal(t, []int{2}, wokenOf(rs), "round %d", round)
		require.Equal(t, []int{2}, askAloneOf(rs), "round %d", round)
		for i, r := range rs {
			want, slowNow := int32(0), false
			if i == 2 && round < slowPolls {
				want = int32(round)
			}
			if i == 2 && round == slowPolls {
				slowNow = true
			}
			require.Equal(t, want, r.idleState.slowRun.Load(), "round %d: relay %d's slow run", round, i)
			require.Equal(t, slowNow, r.idleState.slow.Load(), "round %d: relay %d's slow verdict", round, i)
		}
	}
}
