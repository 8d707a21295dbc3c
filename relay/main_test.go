package relay_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
	code := m.Run()
	if code == 0 {
		code = verifyNoLeaks()
	}
	os.Exit(code)
}

// verifyNoLeaks is goleak's check with a longer wait: a sarama call the
// relay abandoned when its context ended (a hanging broker's tests) finishes
// in its own goroutine only once its connection fails and sarama's metadata
// retries run out, which can outlast goleak's own few retries. Ten seconds
// is far below sarama's timeouts, so a goroutine that really leaks (one
// nothing ever ends) is still reported.
func verifyNoLeaks() int {
	ignore := goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(ignore)
		if err == nil {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			return 1
		}
		time.Sleep(200 * time.Millisecond)
	}
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
