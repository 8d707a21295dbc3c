package relay

// Third review of the grouped questions (df689f0): the estimates
// (Relay.askTook) that size the groups. The two defects found (an answer
// of 0 us taken for none: Relay.answeredIn; SET TRANSACTION's WARNING at
// every group: needsReadCommitted) are fixed since; the comments below
// describe df689f0.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
)

// estimatesOf are the estimates askGrouped derives from rs (askTook, or
// askUnknown when askTook is 0), and groupsOf the groups it would ask them
// in next (none asked alone).
func estimatesOf(rs []*Relay) []time.Duration {
	est := make([]time.Duration, len(rs))
	for i, r := range rs {
		if est[i] = time.Duration(r.askTook.Load()); est[i] <= 0 {
			est[i] = askUnknown
		}
	}
	return est
}

func groupsOf(rs []*Relay) int {
	todo := make([]int, len(rs))
	for i := range todo {
		todo[i] = i
	}
	return len(groupQuestions(make([]bool, len(rs)), estimatesOf(rs), todo))
}

// A quick answer's time is 0 us as often as not: the idle question's
// answer on an empty outbox takes 0-4 us by the server's clock, rounded to
// microseconds (measured here: 11 of 64 answers 0 us at the first round,
// 32-34 of 64 at the next). askTook 0 means "not answered yet", so a target
// answered in 0 us is estimated at askUnknown (5 ms) the next round, like
// one never asked: a group holds 4 of them at most, and 64 quick empty
// targets go in ~10 groups (10 transactions, their settings and syncs)
// instead of 2, every round, forever (a fresh draw each round). The
// estimate of an answered target must be its answer's time, 0 included.
func TestQuestionsQ3ZeroTookIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	for _, tc := range questionPipelines {
		rs := g.relays(64, nil)
		for round := 0; round < 4; round++ {
			require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
			require.Empty(t, wokenOf(rs), "%s: empty outboxes", tc.name)
		}
		var unknown []int
		for i, e := range estimatesOf(rs) {
			if e == askUnknown {
				unknown = append(unknown, i)
			}
		}
		t.Logf("%s: %d of 64 estimated unknown, next round in %d groups", tc.name, len(unknown), groupsOf(rs))
		require.Empty(t, unknown, "%s: targets answered quickly four rounds in a row are estimated as never answered (askTook 0 = askUnknown 5 ms)", tc.name)
		require.Equal(t, 2, groupsOf(rs), "%s: 64 quick targets go in groups of 32", tc.name)
	}
}

// readCommittedSQL (SET TRANSACTION ISOLATION LEVEL READ COMMITTED) starts
// every group after a sync, outside any transaction block (a pipeline's
// implicit transaction is not one before PostgreSQL 17): the server
// applies it, but answers each with a WARNING "SET TRANSACTION can only be
// used in transaction blocks", sent to the client and, at the default
// log_min_messages (warning), written to the server's log. Every group of
// every round: at 1,000 dormant targets polled once a second that is 32+
// warnings a second in the server log, forever, and a busy target's watch
// up to 50 a second each. The questions must not warn.
func TestQuestionsQ3ReadCommittedWarnsEveryGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	cfg, err := pgconn.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Severity+": "+n.Message) }
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close(context.Background()) })
	for _, tc := range questionPipelines {
		for _, prepared := range []map[string]string{{}, nil} {
			notices = nil
			rs := g.relays(8, nil)
			require.NoError(t, tc.pipeline(ctx, pc, prepared, rs), tc.name)
			assert.Empty(t, notices, "%s (prepared %v): one round of 8 targets", tc.name, prepared != nil)
		}
	}
}

// knobOutbox is a schema whose pgbox_outbox is a view that sleeps the
// seconds in its comment at each read and shows one claimable row; set
// sets the knob.
func knobOutbox(t *testing.T) (*testdb.DB, func(secs float64)) {
	t.Helper()
	db := testdb.Empty(t)
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE VIEW pgbox_outbox AS SELECT NULL::timestamptz AS parked_at,
		NULL::bytea AS key, 'w'::text AS topic, 1::bigint AS id, 0::int AS slot
		FROM pg_sleep(coalesce(obj_description(to_regclass(%s || '.pgbox_outbox'), 'pg_class'), '0')::float8)`,
		"'"+pgx.Identifier{db.Schema}.Sanitize()+"'"))
	require.NoError(t, err)
	return db, func(secs float64) {
		_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`COMMENT ON VIEW pgbox_outbox IS '%g'`, secs))
		require.NoError(t, err)
	}
}

// A stale estimate: a target fast, then slow (15 ms: under the group's 20
// ms statement_timeout, over emptySlow) at every round, then fast again.
// Slow, it is answered in its group once (holding the group's locks 15
// ms), then asked alone while slow; fast again, it is back in groups the
// round after, its estimate its last answer's. Pins the promise.
func TestQuestionsQ3StaleEstimate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := newQuestionRig(t)
	knob, set := knobOutbox(t)
	for _, tc := range questionPipelines {
		set(0)
		rs := g.relays(4, map[int]string{1: knob.Schema})
		step := func(what string, alone []int) {
			t.Helper()
			require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
			require.Contains(t, wokenOf(rs), 1, "%s %s: the view shows a row", tc.name, what)
			t.Logf("%s %s: took %v", tc.name, what, time.Duration(rs[1].askTook.Load()))
			require.Equal(t, alone, askAloneOf(rs), "%s %s: asked alone next", tc.name, what)
		}
		for warm := 0; warm < 20 && (warm < 2 || len(askAloneOf(rs)) > 0); warm++ { // first rounds: plans, caches
			require.NoError(t, tc.pipeline(ctx, g.pc, g.prepared, rs), tc.name)
			t.Logf("%s warm-up %d: took %v", tc.name, warm, time.Duration(rs[1].askTook.Load()))
			wokenOf(rs)
		}
		step("fast", nil)
		step("fast", nil)
		set(0.015)
		step("slow in a group", []int{1})
		require.Greater(t, time.Duration(rs[1].askTook.Load()), emptySlow, tc.name)
		step("slow alone", []int{1})
		step("slow alone", []int{1})
		set(0)
		step("fast alone", nil)
		require.Less(t, time.Duration(rs[1].askTook.Load()), time.Millisecond, tc.name)
		step("fast in a group", nil)
	}
}
