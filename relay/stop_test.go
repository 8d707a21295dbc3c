package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/relay"
)

// runAndCancel runs r, calls until (which returns once r is stuck on the
// broker), cancels Run's context and returns how long Run took to return
// after that.
func runAndCancel(t *testing.T, r *relay.Relay, until func()) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	until()
	cancel()
	canceled := time.Now()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("Run did not return within two minutes of its context being canceled")
	}
	return time.Since(canceled)
}

// With the library's own Kafka defaults (30 s network timeouts, retried),
// a relay whose broker accepts connections and never answers returns from
// Run within StopTimeout of its context being canceled, at start-up.
func TestRunStopsWhileBrokerHangsAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr, accepted := kafkatest.HangingBroker(t)
	cfg := b.config("a")
	cfg.Brokers = []string{addr}
	cfg.Kafka = nil // the library's defaults
	r, err := relay.New(cfg)
	require.NoError(t, err)
	took := runAndCancel(t, r, func() {
		testutil.Eventually(t, 30*time.Second, "relay connected to the broker", func() bool { return accepted() > 0 })
	})
	require.Less(t, took, relay.StopTimeoutDefault)
}

// Mid-send: the broker answered at first, then hangs on every request
// (metadata, producer ids, produce) while the relay has rows of a topic it
// has not looked up yet. Run returns within StopTimeout of its context
// being canceled.
func TestRunStopsWhileBrokerHangsMidSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// kfake deadlocks its own run loop if it closes while a slept
	// request is being resumed (a request whose sleep ended at the close
	// holds the control lock the loop then waits for), so the cleanup,
	// which runs before the broker closes, stops new sleeps, wakes the
	// slept requests and waits until every one has left its control
	// function.
	release := make(chan struct{})
	var mu sync.Mutex
	hang, sleeping := false, 0
	var hung atomic.Int64
	t.Cleanup(func() {
		mu.Lock()
		hang = false
		mu.Unlock()
		close(release)
		testutil.Eventually(t, 30*time.Second, "slept requests resumed", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return sleeping == 0
		})
	})
	b.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		mu.Lock()
		sleep := hang
		if sleep {
			sleeping++
		}
		mu.Unlock()
		if sleep {
			hung.Add(1)
			b.cluster.SleepControl(func() { <-release })
			mu.Lock()
			sleeping--
			mu.Unlock()
		}
		return nil, nil, false
	})
	cfg := b.config("a")
	cfg.StopTimeout = 2 * time.Second
	r, err := relay.New(cfg)
	require.NoError(t, err)
	took := runAndCancel(t, r, func() {
		b.write(t, msg(b.topic, "k", "before"))
		require.Len(t, readTopic(t, b, b.topic, 1), 1)
		testutil.Eventually(t, 30*time.Second, "published counted", func() bool { return r.Stats().Published == 1 })
		mu.Lock()
		hang = true
		mu.Unlock()
		b.write(t, msg("other", "k", "never answered"), msg(b.topic, "k", "never answered"))
		testutil.Eventually(t, 30*time.Second, "relay waiting on the broker", func() bool { return hung.Load() > 0 })
	})
	require.Less(t, took, cfg.StopTimeout+time.Second)
}
