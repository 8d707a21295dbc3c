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

// envScenarios runs the environment scenarios in `make test` too (`make
// chaos` always runs them).
const envScenarios = "CHAOS_SCENARIOS"

// scenarioWorld starts the chain for one environment scenario. Scenarios
// run in `make chaos` (CHAOS_SCALE=large) or with CHAOS_SCENARIOS=1: two of
// them fail on code without the fixes named in their docs.
func scenarioWorld(t *testing.T, opts harness.Options) (context.Context, *harness.World) {
	t.Helper()
	if testing.Short() {
		t.Skip("scenario skipped in -short mode")
	}
	if os.Getenv(envScenarios) != "1" && os.Getenv(envScale) != "large" {
		t.Skipf("environment scenario: runs in `make chaos`, or with %s=1", envScenarios)
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
// accepts, all with retention.ms -1. A cleanup pass must keep every inbox
// key (Kafka may redeliver any of those records, forever), and a rewind of
// the group to offset 0 must cause no second effect. Depends on the
// cleanup.policy parsing fix (seams).
func TestScenarioCleanupPolicies(t *testing.T) {
	policies := map[string]string{
		"orders.policy-delete":         "delete",
		"orders.policy-compact":        "compact",
		"orders.policy-compact-delete": "compact,delete",
		"orders.policy-empty":          "",
	}
	opts := harness.Options{TopicConfigs: map[string]map[string]string{}}
	for topic, policy := range policies {
		opts.OrderTopics = append(opts.OrderTopics, topic)
		opts.TopicConfigs[topic] = map[string]string{"cleanup.policy": policy, "retention.ms": "-1", "segment.ms": "1000"}
	}
	ctx, w := scenarioWorld(t, opts)
	const events = 1200
	require.NoError(t, w.StartOrders(events, 200, 1))
	exits, err := w.WaitDrained(ctx, events, 5*time.Minute)
	require.NoError(t, err)
	require.Empty(t, exits)
	require.NoError(t, w.WaitConsumed(ctx, time.Minute))

	time.Sleep(3 * time.Second) // every key is now older than segment.ms + buffer
	before, err := w.InboxKeys(ctx)
	require.NoError(t, err)
	out, err := w.Cleanup(ctx)
	require.NoError(t, err)
	after, err := w.InboxKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after, "cleanup deleted inbox keys of topics Kafka keeps forever:\n%s", out)

	require.NoError(t, w.Rewind(ctx))
	require.NoError(t, w.WaitConsumed(ctx, 3*time.Minute), "the rewound group re-reads every topic from offset 0")
	requireVerdict(ctx, t, w)
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

	exits, err := w.WaitDrained(ctx, events, 5*time.Minute)
	require.NoError(t, err, "processing must resume once the table is back")
	require.Empty(t, exits)
	requireVerdict(ctx, t, w)
}
