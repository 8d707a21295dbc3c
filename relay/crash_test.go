package relay_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A relay running as a real process is killed with SIGKILL mid-run while
// writers keep writing. Another instance takes its lanes over; nothing is
// lost, per-key order holds, and the only duplicates are the killed
// process's in-flight batches (the one being sent and the previous one,
// whose delete may not have committed), each with the same event id as the
// original.
func TestKilledRelayProcessIsTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const keys, childBatch = 10, 32
	createCounters(t, b, keys)

	child, exited := startChild(t, b, childBatch)
	ownedBy := func(owner string) int { return lanesOwnedBy(t, b, owner) }
	waitFor(t, "child holds lanes", func() bool { return ownedBy("child") == 8 })
	parent := start(t, b.config("parent"))
	waitFor(t, "lanes split", func() bool { return ownedBy("child") > 0 && parent.r.Stats().Lanes > 0 })

	// Writers run throughout.
	stop, written, wg := startWriters(ctx, t, b, keys, 7)
	// Kill the child while it is publishing its share.
	waitFor(t, "traffic", func() bool { return written.Load() > 300 })
	require.NoError(t, child.Process.Kill()) // SIGKILL
	killedAt := time.Now()
	<-exited
	waitFor(t, "parent takes every lane", func() bool { return parent.r.Stats().Lanes == 8 })
	t.Logf("lanes taken over %s after SIGKILL (bound: LeaseTTL + HeartbeatInterval = 1.1s)", time.Since(killedAt).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond) // more traffic after the takeover
	stop.Store(true)
	wg.Wait()

	checkAllArrived(t, b, int(written.Load()), 2*childBatch, "killed")
}

// A relay process is paused (SIGSTOP) past its lease while writers keep
// writing, so another instance takes its lanes; then it resumes (SIGCONT)
// with whatever it had in hand. The lane epochs fence it: nothing is lost,
// per-key order holds for a deduping consumer, and duplicates are bounded by
// its two in-flight batches and carry the original event ids.
func TestPausedRelayProcessIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const keys, childBatch = 10, 32
	createCounters(t, b, keys)

	child, _ := startChild(t, b, childBatch)
	// Registered after startChild's cleanup, so it runs first: a stopped
	// process must be continued before it can be killed and reaped.
	t.Cleanup(func() { _ = child.Process.Signal(syscall.SIGCONT) })
	ownedBy := func(owner string) int { return lanesOwnedBy(t, b, owner) }
	waitFor(t, "child holds lanes", func() bool { return ownedBy("child") == 8 })
	parent := start(t, b.config("parent"))

	stop, written, wg := startWriters(ctx, t, b, keys, 9)
	waitFor(t, "traffic with lanes split", func() bool { return written.Load() > 200 && ownedBy("child") > 0 })
	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	waitFor(t, "parent takes every lane", func() bool { return parent.r.Stats().Lanes == 8 })
	time.Sleep(300 * time.Millisecond) // the parent publishes newer events of the child's keys
	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	waitFor(t, "child rejoins", func() bool { return ownedBy("child") > 0 })
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	checkAllArrived(t, b, int(written.Load()), 2*childBatch, "paused")
}

// startChild runs a relay named "child" in a real process (this test binary,
// in its child mode), killed and reaped when the test ends; exited closes when
// it has exited.
func startChild(t *testing.T, b *testBundle, batch int) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = b.childEnv("child", batch)
	if os.Getenv("PGBOX_TEST_LOG") != "" {
		child.Stderr = os.Stderr
	}
	require.NoError(t, child.Start())
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() { _ = child.Process.Kill(); <-exited })
	return child, exited
}

// lanesOwnedBy counts the live lane leases of the instance named owner (lease
// owners are the instance name plus a random suffix).
func lanesOwnedBy(t *testing.T, b *testBundle, owner string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgbox_relay_lanes WHERE owner LIKE $1 || '#%' AND expires_at > now()`, owner).Scan(&n))
	return n
}

// startWriters runs four writers of counted events over keys until stop is
// set; written counts the committed events. Wait on wg after setting stop.
func startWriters(ctx context.Context, t *testing.T, b *testBundle, keys int, seed uint64) (stop *atomic.Bool, written *atomic.Int64, wg *sync.WaitGroup) {
	stop, written, wg = new(atomic.Bool), new(atomic.Int64), new(sync.WaitGroup)
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for !stop.Load() {
				if err := writeCounted(ctx, b, keyed(rng.IntN(keys))); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
			}
		})
	}
	return stop, written, wg
}

// checkAllArrived reads every one of total written events from Kafka, checks
// per-key order, allows at most maxDups duplicates (from the child process,
// "killed" or "paused", and its two in-flight batches), and waits for the
// outbox to empty.
func checkAllArrived(t *testing.T, b *testBundle, total, maxDups int, child string) {
	t.Helper()
	got := readEvents(t, b, total)
	require.GreaterOrEqual(t, len(got), total)
	dups := checkOrder(t, b, got)
	t.Logf("%d events, %d records, %d duplicates", total, len(got), dups)
	require.LessOrEqual(t, dups, maxDups, "duplicates only from the %s process's two in-flight batches", child)
	waitFor(t, "outbox emptied", func() bool { return b.outboxCount(t, "true") == 0 })
}
