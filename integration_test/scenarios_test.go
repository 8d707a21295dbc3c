package integration_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
)

// scenarioWorld starts the chain for one environment scenario. They run in
// `make test` (and alone with `make chaos-scenarios`).
func scenarioWorld(t *testing.T, opts harness.Options) (context.Context, *harness.World) {
	t.Helper()
	if testing.Short() {
		t.Skip("scenario skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	opts.Logf = func(f string, a ...any) { fmt.Printf(t.Name()+": "+f+"\n", a...) }
	w, err := harness.NewWorld(ctx, opts)
	require.NoError(t, err, "start the chain")
	t.Cleanup(func() {
		keep := t.Failed() || os.Getenv(envKeep) == "1"
		w.Close(keep)
		if keep {
			fmt.Printf("%s: logs kept in %s:\n  %v\n", t.Name(), w.Dir, w.LogPaths())
		}
	})
	return ctx, w
}

// requireDrained waits for every order's effect and downstream record and
// then for the verdict; when the chain does not drain, the verdict is
// printed before the test fails (it names what went missing).
func requireDrained(ctx context.Context, t *testing.T, w *harness.World, events int64, timeout time.Duration) {
	t.Helper()
	exits, err := w.WaitDrained(ctx, events, timeout)
	if err != nil {
		v, verr := w.Verify(ctx)
		require.NoError(t, err, "the chain did not drain (verify error %v); verdict: %+v", verr, v)
	}
	require.Empty(t, exits, "processes exited by themselves")
	requireVerdict(ctx, t, w)
}

// requireVerdict verifies the chain and fails with the first violations.
func requireVerdict(ctx context.Context, t *testing.T, w *harness.World) harness.Verdict {
	t.Helper()
	v, err := w.Verify(ctx)
	require.NoError(t, err)
	fmt.Printf("%s: produced %d, effects %d, lost %d, duplicate effects %d, order inversions %d, dead letters %d, parked %d, duplicate records %d\n",
		t.Name(), v.Produced, v.Effects, v.Lost, v.DuplicateEffects, v.OrderInversions, v.DeadLetters, v.Parked, v.DuplicateRecords)
	require.True(t, v.OK(), "first violations: %v", v.First)
	return v
}

// TestScenarioCleanupPolicies: one consumed topic per cleanup.policy Kafka
// accepts (delete, compact, "compact,delete", empty), each with
// retention.ms -1 and with a 2s retention. The broker applies retention; a
// cleanup pass must keep every inbox key of a topic whose log start did not
// move (retention -1); then the group is rewound to the earliest offsets (0
// where nothing was deleted), and no order may take effect twice. (The
// embedded broker applies retention.ms whatever the policy, where a real
// broker ignores it without delete: cleanup's exact rule follows the log
// start either way.) Depends on the cleanup.policy parsing fix (seams).
func TestScenarioCleanupPolicies(t *testing.T) {
	opts := harness.Options{TopicConfigs: map[string]map[string]string{}}
	prunable := map[string]bool{}
	for name, policy := range map[string]string{"delete": "delete", "compact": "compact", "compact-delete": "compact,delete", "empty": ""} {
		for _, ret := range []string{"-1", "2000"} {
			topic := fmt.Sprintf("orders.policy-%s.retention%s", name, ret)
			opts.OrderTopics = append(opts.OrderTopics, topic)
			opts.TopicConfigs[topic] = map[string]string{"cleanup.policy": policy, "retention.ms": ret, "segment.ms": "1000"}
			prunable[topic] = ret != "-1"
		}
	}
	ctx, w := scenarioWorld(t, opts)
	const events = 1600
	require.NoError(t, w.StartOrders(events, 200, 1))
	requireDrained(ctx, t, w, events, 5*time.Minute)
	require.NoError(t, w.WaitConsumed(ctx, time.Minute))

	time.Sleep(5 * time.Second) // every key is now past retention + segment.ms + buffer
	require.NoError(t, w.ApplyRetention())
	before, err := inboxKeysByTopic(ctx, w)
	require.NoError(t, err)
	out, err := w.Cleanup(ctx)
	require.NoError(t, err)
	after, err := inboxKeysByTopic(ctx, w)
	require.NoError(t, err)
	for _, topic := range opts.OrderTopics {
		require.NotZero(t, before[topic], topic)
		if prunable[topic] {
			continue
		}
		require.Equal(t, before[topic], after[topic], "cleanup deleted inbox keys of %s (%v), whose records Kafka keeps:\n%s", topic, opts.TopicConfigs[topic], out)
	}

	require.NoError(t, w.Rewind(ctx))
	require.NoError(t, w.WaitConsumed(ctx, 3*time.Minute), "the rewound group re-reads every topic from its earliest offset")
	requireVerdict(ctx, t, w)
}

func inboxKeysByTopic(ctx context.Context, w *harness.World) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, w.PG.URL(harness.PaymentsDB))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `SELECT topic, count(*) FROM pgbox_inbox GROUP BY topic`)
	out := map[string]int64{}
	var topic string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&topic, &n}, func() error { out[topic] = n; return nil })
	return out, err
}

// TestScenarioBadDeploy: the payments service's business table disappears
// for 30 seconds (a bad migration), then comes back. No message may be
// dead-lettered for it, and processing must resume by itself, losing
// nothing. Depends on the adapter classifying "undefined table" as an
// infrastructure error rather than the message's fault (inbox).
func TestScenarioBadDeploy(t *testing.T) {
	ctx, w := scenarioWorld(t, harness.Options{})
	const events = 1500
	require.NoError(t, w.StartOrders(events, 30, 2))
	time.Sleep(8 * time.Second)

	admin, err := pgx.Connect(ctx, w.PG.URL(harness.PaymentsDB))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `ALTER TABLE payments RENAME TO payments_gone`)
	require.NoError(t, err)
	time.Sleep(30 * time.Second)
	_, err = admin.Exec(ctx, `ALTER TABLE payments_gone RENAME TO payments`)
	require.NoError(t, err)

	requireDrained(ctx, t, w, events, 3*time.Minute)
}
