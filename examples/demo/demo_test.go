package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// demoBin is the demo binary, built once for the package's tests (with
// -race when the tests are, so the subprocess is checked too).
var demoBin string

func TestMain(m *testing.M) { testutil.MainWithBinary(m, "demo", &demoBin) }

type result = testutil.Result

// runDemo runs the demo binary with args and only the environment given
// (see testutil.CleanEnv).
func runDemo(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	return testutil.RunToEnd(t, timeout, demoBin, env, args...)
}

// demoSchema names a schema for one demo run and drops it when the test ends.
func demoSchema(t *testing.T) string {
	t.Helper()
	name := "demo_" + strings.ToLower(strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name += "_" + randSuffix()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, testdb.ServerURL(t))
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	return name
}

func randSuffix() string { return strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "") }

// TestDemoShort runs the demo as `make demo` does, smaller: its own summary
// check must pass, and the numbers it prints must add up.
func TestDemoShort(t *testing.T) {
	t.Parallel()
	schema := demoSchema(t)
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t)}
	r := runDemo(t, 3*time.Minute, env, "--orders=300", "--replay=40", "--rate=0", "--partitions=3",
		"--demo-schema="+schema, "--duration=150s")
	require.Equal(t, 0, r.Code, "stdout:\n%s\nstderr:\n%s", r.Stdout, r.Stderr)
	for _, want := range []string{
		`orders sent \(unique\)\s+300\s`,
		`replayed from an earlier offset\s+40\s`,
		`business rows \(demo_charges\)\s+300\s+ok: equals unique orders \(300 distinct order ids\)`,
		`payments published\s+300\s+ok: 300 of 300 orders paid, 0 paid more than once`,
		`end-to-end latency p50 / p99\s+\S+ / \S+`,
		`cleanup \(one pass\)\s+0 deleted`,
		`(?m)^PASS`,
	} {
		require.Regexp(t, want, r.Stdout)
	}
	require.Contains(t, r.Stderr, "orders sent 300/300", "the progress line ends with the final counts")

	// Re-running works: the schema is reset at start.
	r = runDemo(t, 3*time.Minute, env, "--orders=50", "--replay=5", "--rate=0", "--partitions=2", "--consumers=1",
		"--demo-schema="+schema, "--duration=150s", "--keep-schema=false")
	require.Equal(t, 0, r.Code, "stdout:\n%s\nstderr:\n%s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, "PASS")
}

// TestDemoCheckFails: with offset keys the inbox cannot see that a resend is
// the same order, so orders are charged twice: the summary check must catch
// it and exit non-zero.
func TestDemoCheckFails(t *testing.T) {
	t.Parallel()
	schema := demoSchema(t)
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t)}
	r := runDemo(t, 3*time.Minute, env, "--orders=100", "--replay=20", "--duplicate-percent=20", "--rate=0",
		"--partitions=2", "--dedup-key=offset", "--demo-schema="+schema, "--duration=150s", "--keep-schema=false")
	require.Equal(t, 1, r.Code, "stdout:\n%s\nstderr:\n%s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stdout, "FAILED: DIFFERS FROM unique orders")
	require.Regexp(t, `payments published\s+100\s+FAILED: 100 of 100 orders paid, [1-9]\d* paid more than once`, r.Stdout)
	require.Regexp(t, `(?m)^FAIL$`, r.Stdout)
	require.Contains(t, r.Stderr, "demo check failed")
}

// TestDemoExternalBrokerWithSASL points the demo at a broker of its own
// (KAFKA_BROKERS set) that requires SCRAM-SHA-512: the demo creates its own
// topics there and every client of the binary (producer, consumer group,
// relay, cleanup's admin, the verifier) authenticates.
func TestDemoExternalBrokerWithSASL(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "demo", "p4ss"))
	schema := demoSchema(t)
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","),
		"PGBOX_KAFKA_SASL_MECHANISM=SCRAM-SHA-512", "PGBOX_KAFKA_SASL_USER=demo", "PGBOX_KAFKA_SASL_PASSWORD=p4ss"}
	r := runDemo(t, 3*time.Minute, env, "--orders=60", "--replay=6", "--rate=0", "--partitions=2",
		"--demo-schema="+schema, "--duration=150s", "--keep-schema=false")
	require.Equal(t, 0, r.Code, "stdout:\n%s\nstderr:\n%s", r.Stdout, r.Stderr)
	require.Contains(t, r.Stderr, "Kafka at "+c.ListenAddrs()[0])
	require.Regexp(t, `(?m)^PASS`, r.Stdout)
	require.NotContains(t, r.Stdout+r.Stderr, "p4ss")
}

// TestDemoExternalBrokerWithMutualTLS: the same against a broker that
// requires TLS with a client certificate.
func TestDemoExternalBrokerWithMutualTLS(t *testing.T) {
	t.Parallel()
	pki := kafkatest.NewPKI(t)
	c := kafkatest.New(t, kfake.TLS(pki.ServerTLS))
	schema := demoSchema(t)
	env := []string{"DATABASE_URL=" + testdb.ServerURL(t), "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ","),
		"PGBOX_KAFKA_TLS_CA=" + pki.CAFile, "PGBOX_KAFKA_TLS_CERT=" + pki.CertFile, "PGBOX_KAFKA_TLS_KEY=" + pki.KeyFile}
	r := runDemo(t, 3*time.Minute, env, "--orders=60", "--replay=6", "--rate=0", "--partitions=2",
		"--demo-schema="+schema, "--duration=150s", "--keep-schema=false")
	require.Equal(t, 0, r.Code, "stdout:\n%s\nstderr:\n%s", r.Stdout, r.Stderr)
	require.Regexp(t, `(?m)^PASS`, r.Stdout)
}

// TestDemoUsageErrors: bad settings exit 2 naming the setting, and no
// password reaches the output. (Moved from cmd/relay with the demo.)
func TestDemoUsageErrors(t *testing.T) {
	t.Parallel()
	db := []string{"DATABASE_URL=postgres://alice:hunter2@127.0.0.1:1/db"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"replay > orders", db, []string{"--orders", "10", "--replay", "11"}, []string{"--replay", "at most --orders"}},
		{"missing database", nil, nil, []string{"DATABASE_URL", "--database-url"}},
		{"bad env", append(db, "PGBOX_DEMO_ORDERS=many"), nil, []string{"PGBOX_DEMO_ORDERS", `"many"`}},
		{"arguments", db, []string{"extra"}, []string{"no arguments"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runDemo(t, time.Minute, tc.env, tc.args...)
			require.Equal(t, 2, r.Code, "stderr: %s", r.Stderr)
			for _, w := range tc.want {
				require.Contains(t, r.Stderr, w)
			}
			require.NotContains(t, r.Stderr+r.Stdout, "hunter2")
		})
	}
}
