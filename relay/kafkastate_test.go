package relay_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
)

// instanceRow reads an instance's Kafka state; ok is false without a row.
func instanceRow(t *testing.T, b *testBundle, instance string) (ready, down, ok bool) {
	t.Helper()
	err := b.db.Pool.QueryRow(context.Background(),
		`SELECT kafka_ready, kafka_down_since IS NOT NULL FROM pgbox_relay_instances WHERE instance = $1`, instance).Scan(&ready, &down)
	if err != nil {
		return false, false, false
	}
	return ready, down, true
}

// A relay that cannot reach Kafka registers anyway: status shows it
// running with Kafka unreachable (it used to say "none running"), it takes
// no lanes from an instance that can publish, and once the outage has
// lasted KafkaOutageAlert it logs at ERROR, once.
func TestRelayWithoutKafkaIsRegisteredAndReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := start(t, b.config("a"))
	waitFor(t, "a holds every lane", func() bool { return a.r.Stats().Lanes == 8 })

	addr, _ := kafkatest.HangingBroker(t)
	var logs lockedBuffer
	cfg := b.config("b")
	cfg.Brokers = []string{addr}
	cfg.Kafka = nil // the library's defaults: 30 s network timeouts
	cfg.KafkaOutageAlert = 500 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	down := start(t, cfg)

	testutil.Eventually(t, 30*time.Second, "b registered, Kafka unreachable", func() bool {
		ready, isDown, ok := instanceRow(t, b, down.r.Instance())
		return ok && !ready && isDown
	})
	snap, err := inspect.Read(ctx, b.db.Pool, inspect.Config{})
	require.NoError(t, err)
	var text bytes.Buffer
	snap.WriteText(&text)
	require.Contains(t, text.String(), down.r.Instance())
	require.Contains(t, text.String(), "running, Kafka unreachable since")
	require.NotContains(t, text.String(), "none running")

	testutil.Eventually(t, 30*time.Second, "the outage logged at ERROR", func() bool {
		return strings.Contains(logs.String(), `level=ERROR msg="Kafka unreachable"`)
	})
	for range 5 { // more heartbeats: still one ERROR line, and a keeps its lanes
		testutil.Eventually(t, 10*time.Second, "a heartbeat of b", func() bool {
			var at time.Time
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT heartbeat_at FROM pgbox_relay_instances WHERE instance = $1`, down.r.Instance()).Scan(&at))
			return time.Since(at) < 150*time.Millisecond
		})
	}
	require.Equal(t, 1, strings.Count(logs.String(), "level=ERROR"), logs.String())
	require.Equal(t, 8, a.r.Stats().Lanes, "an instance that cannot reach Kafka takes no lanes")
	require.Equal(t, 1, a.r.Stats().Instances)
	require.Zero(t, down.r.Stats().Lanes)

	down.stop(t)
	_, _, ok := instanceRow(t, b, down.r.Instance())
	require.False(t, ok, "a stopped instance removes itself")
}

// Kafka goes away while the relay runs and has rows to send: the instance
// records the outage (status shows it), logs it at ERROR past
// KafkaOutageAlert, keeps its lanes, and clears it once Kafka answers.
func TestKafkaOutageMidRunIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var brokerDown atomic.Bool
	b.cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		b.cluster.KeepControl()
		if brokerDown.Load() {
			return nil, errors.New("broker down"), true // closes the connection
		}
		return nil, nil, false
	})
	var logs lockedBuffer
	cfg := b.config("a")
	cfg.KafkaOutageAlert = 500 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	a := start(t, cfg)
	b.write(t, msg(b.topic, "k", "before"))
	require.Len(t, readTopic(t, b, b.topic, 1), 1)
	ready, isDown, ok := instanceRow(t, b, a.r.Instance())
	require.True(t, ok && ready && !isDown)

	brokerDown.Store(true)
	b.write(t, msg(b.topic, "k", "during"))
	testutil.Eventually(t, 30*time.Second, "the outage recorded", func() bool {
		_, isDown, _ := instanceRow(t, b, a.r.Instance())
		return isDown
	})
	testutil.Eventually(t, 30*time.Second, "the outage logged at ERROR", func() bool {
		return strings.Contains(logs.String(), `level=ERROR msg="Kafka unreachable"`)
	})
	require.Equal(t, 8, a.r.Stats().Lanes, "the lanes stay")

	brokerDown.Store(false)
	require.Len(t, readTopic(t, b, b.topic, 2), 2)
	testutil.Eventually(t, 30*time.Second, "the outage cleared", func() bool {
		_, isDown, _ := instanceRow(t, b, a.r.Instance())
		return !isDown
	})
	require.Contains(t, logs.String(), "Kafka reachable again")
}
