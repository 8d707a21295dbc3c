package relay_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/relay"
)

// Child mode: the test binary re-executed with PGBOX_RELAY_CHILD set runs one
// relay instance until it is killed. Crash tests kill it with SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("PGBOX_RELAY_CHILD") != "" {
		os.Exit(runChild())
	}
	// Every relay, producer, broker and pool a test starts is gone when the
	// tests end (sarama's client included: Run closes its producer). The
	// one exception is go-metrics' process-wide meter ticker, which sarama
	// starts once and nothing stops.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

func runChild() int {
	ctx := context.Background()
	env := func(k string) string { return os.Getenv("PGBOX_RELAY_" + k) }
	pool, err := pgxpool.New(ctx, env("DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	batch, _ := strconv.Atoi(env("BATCH"))
	b := &testBundle{addrs: strings.Split(env("BROKERS"), ","), channel: env("CHANNEL")}
	cfg := b.configWithPool(pool, env("CHILD"))
	cfg.BatchSize = batch
	r, err := relay.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// childEnv is the environment that makes the test binary run a relay.
func (b *testBundle) childEnv(name string, batch int) []string {
	return append(os.Environ(),
		"PGBOX_RELAY_CHILD="+name,
		"PGBOX_RELAY_DB="+b.db.URL,
		"PGBOX_RELAY_BROKERS="+strings.Join(b.addrs, ","),
		"PGBOX_RELAY_CHANNEL="+b.channel,
		"PGBOX_RELAY_BATCH="+strconv.Itoa(batch),
	)
}
