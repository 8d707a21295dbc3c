package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// TestRunSIGTERMWhileBrokerHangs: the broker accepts connections and never
// answers. `relay run`, sent SIGTERM in that state, exits with status 0
// well within its shutdown timeout (it used to wait the whole deadline out
// and exit 1, when Kubernetes SIGKILLs a pod with the default grace period).
func TestRunSIGTERMWhileBrokerHangs(t *testing.T) {
	t.Parallel()
	addr, accepted := kafkatest.HangingBroker(t)

	db := testdb.New(t)
	writeRows(t, db, "payments", 0, 5)
	const shutdown = 10 * time.Second
	env := append(runEnv(db, kafkatest.New(t)), "KAFKA_BROKERS="+addr,
		"PGBOX_KAFKA_TIMEOUT=10s", "PGBOX_SHUTDOWN_TIMEOUT="+shutdown.String())
	p := startRelay(t, env, "run")
	p.HTTPAddr(t)
	waitFor(t, "connections to the hanging broker", 30*time.Second, func() bool { return accepted() > 0 })

	sent := time.Now()
	code := p.signal(t, syscall.SIGTERM)
	took := time.Since(sent)
	require.Equal(t, 0, code, p.Output())
	require.Less(t, took, shutdown, p.Output())
	t.Logf("exited %s after SIGTERM", took)
}

// TestStatusShowsRelayWithoutKafka: a `relay run` that cannot reach Kafka is
// running, and `relay status` says so (it used to say "none running").
func TestStatusShowsRelayWithoutKafka(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	env := append(runEnv(db, kafkatest.New(t)), "KAFKA_BROKERS=127.0.0.1:1") // nothing listens on port 1
	p := startRelay(t, env, "run")
	p.HTTPAddr(t)
	var out string
	waitFor(t, "status shows the instance", 30*time.Second, func() bool {
		r := runRelay(t, time.Minute, []string{"DATABASE_URL=" + db.URL}, "status")
		out = r.Stdout
		return r.Code == 0 && strings.Contains(out, "running, Kafka unreachable since")
	})
	require.NotContains(t, out, "none running")
	require.Equal(t, 0, p.stop(t), p.Output())
}
