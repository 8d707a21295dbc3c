package main

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// setFn gives one setting a value, as a flag or as its environment variable.
type setFn func(value string) (args, env []string)

// flagCheck observes one setting's effect from outside the binary: what it
// prints, serves, writes to the database or sends to Kafka.
type flagCheck struct {
	check func(t *testing.T, set setFn)
	// bad is a value the setting refuses with exit status 2; empty when every
	// text is accepted (free-form names and paths).
	bad string
}

// flagChecks has one entry per setting of the binary (TestEveryFlagIsChecked
// fails for a setting without one).
var flagChecks = map[string]flagCheck{
	"database-url": {check: checkDatabaseURL},
	"schema":       {check: checkSchema, bad: "a,b"},
	"db-max-conns": {check: checkDBMaxConns, bad: "1"},

	"kafka-brokers":         {check: checkKafkaBrokers, bad: "kafka-without-port"},
	"kafka-version":         {check: checkKafkaVersion, bad: "0.10.2"},
	"kafka-client-id":       {check: checkKafkaClientID},
	"kafka-timeout":         {check: checkKafkaTimeout, bad: "0s"},
	"kafka-sasl-mechanism":  {check: checkSASL("mechanism"), bad: "GSSAPI"},
	"kafka-sasl-user":       {check: checkSASL("user")},
	"kafka-sasl-password":   {check: checkSASL("password")},
	"kafka-tls":             {check: checkKafkaTLS, bad: "maybe"},
	"kafka-tls-ca":          {check: checkTLSFile("ca")},
	"kafka-tls-cert":        {check: checkTLSFile("cert")},
	"kafka-tls-key":         {check: checkTLSFile("key")},
	"kafka-tls-skip-verify": {check: checkTLSSkipVerify, bad: "maybe"},

	"lanes":                   {check: checkLanes, bad: "0"},
	"instance":                {check: checkInstance},
	"batch-size":              {check: checkBatchSize, bad: "0"},
	"poll-interval":           {check: checkPollInterval, bad: "0s"},
	"heartbeat-interval":      {check: checkHeartbeat, bad: "0s"},
	"lease-ttl":               {check: checkLeaseTTL, bad: "0s"},
	"max-attempts":            {check: checkMaxAttempts, bad: "0"},
	"max-backoff":             {check: checkMaxBackoff, bad: "0s"},
	"unknown-topic-window":    {check: checkUnknownTopicWindow, bad: "-1s"},
	"kafka-outage-alert":      {check: checkKafkaOutageAlert, bad: "0s"},
	"sweep-interval":          {check: checkSweepInterval, bad: "0s"},
	"no-listen":               {check: checkNoListen, bad: "maybe"},
	"channel":                 {check: checkChannel, bad: strings.Repeat("c", 64)},
	"partitioner":             {check: checkPartitioner, bad: "random"},
	"kafka-max-message-bytes": {check: checkMaxMessageBytes, bad: "0"},

	"cleanup-interval":   {check: checkCleanupInterval, bad: "-1s"},
	"cleanup-buffer":     {check: checkCleanupBuffer, bad: "-1s"},
	"cleanup-window":     {check: checkCleanupWindow, bad: "-1h"},
	"cleanup-batch-size": {check: checkCleanupBatchSize, bad: "0"},
	"cleanup-pause":      {check: checkCleanupPause, bad: "-1s"},
	"keep-parked":        {check: checkKeep("keep-parked", "pgbox_outbox (parked)"), bad: "0s"},
	"keep-dead-letters":  {check: checkKeep("keep-dead-letters", "pgbox_consumer_dead"), bad: "0s"},
	"keep-attempts":      {check: checkKeep("keep-attempts", "pgbox_consumer_attempts"), bad: "0s"},
	"dry-run":            {check: checkDryRun, bad: "maybe"},

	"http-addr": {check: checkHTTPAddr, bad: "not-an-address"},
	"json":      {check: checkJSON, bad: "maybe"},

	"log-format":       {check: checkLogFormat, bad: "xml"},
	"log-level":        {check: checkLogLevel, bad: "loud"},
	"shutdown-timeout": {check: checkShutdownTimeout, bad: "0s"},
}

// allSettings is every setting the binary defines, from the table it uses.
func allSettings() []*setting {
	set := newSettings()
	(&options{}).bind(set, allGroups...)
	return set.list
}

// commandOf returns a command that reads the setting.
func commandOf(t *testing.T, name string) string {
	t.Helper()
	for _, c := range commands {
		set := newSettings()
		(&options{}).bind(set, c.groups...)
		for _, st := range set.list {
			if st.name == name {
				return c.name
			}
		}
	}
	t.Fatalf("no command reads --%s", name)
	return ""
}

func TestEveryFlagIsChecked(t *testing.T) {
	t.Parallel()
	defined := map[string]bool{}
	for _, st := range allSettings() {
		defined[st.name] = true
		require.Contains(t, flagChecks, st.name, "--%s (%s) has no entry in flagChecks: add a check of its effect", st.name, st.env)
	}
	for name := range flagChecks {
		require.True(t, defined[name], "flagChecks has %q, which the binary does not define", name)
	}
}

// TestFlags sets every setting once by flag and once by environment variable
// and observes its effect.
func TestFlags(t *testing.T) {
	t.Parallel()
	for _, st := range allSettings() {
		fc, ok := flagChecks[st.name]
		if !ok {
			continue // TestEveryFlagIsChecked fails
		}
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			t.Run("flag", func(t *testing.T) {
				fc.check(t, func(v string) ([]string, []string) { return []string{"--" + st.name + "=" + v}, nil })
			})
			t.Run("env", func(t *testing.T) {
				fc.check(t, func(v string) ([]string, []string) { return nil, []string{st.env + "=" + v} })
			})
		})
	}
}

// TestFlagBadValues: a refused value exits 2 with exactly one line that names
// the flag and its variable and says what is accepted.
func TestFlagBadValues(t *testing.T) {
	t.Parallel()
	base := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db", "KAFKA_BROKERS=127.0.0.1:9092"}
	for _, st := range allSettings() {
		bad := flagChecks[st.name].bad
		if bad == "" {
			continue
		}
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			cmd := commandOf(t, st.name)
			for via, run := range map[string]func() result{
				"flag": func() result { return runRelay(t, time.Minute, base, cmd, "--"+st.name+"="+bad) },
				"env":  func() result { return runRelay(t, time.Minute, append(base[:2:2], st.env+"="+bad), cmd) },
			} {
				r := run()
				require.Equal(t, 2, r.Code, "%s %s=%q: %s", via, st.name, bad, r.Stderr)
				lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
				require.Len(t, lines, 1, "%s: one error line: %s", via, r.Stderr)
				require.Contains(t, r.Stderr, "--"+st.name, via)
				require.Contains(t, r.Stderr, st.env, via)
				require.Regexp(t, `must|needs|cannot|be `, r.Stderr, "%s: says what is accepted", via)
			}
		})
	}
}

// TestRuntimeErrorPrintedOnce: a runtime failure exits 1 with its error
// printed once, as one line (text) or one JSON record.
func TestRuntimeErrorPrintedOnce(t *testing.T) {
	t.Parallel()
	unreachable := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}
	r := runRelay(t, time.Minute, unreachable, "migrate", "status")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Len(t, strings.Split(strings.TrimSpace(r.Stderr), "\n"), 1, r.Stderr)
	require.Contains(t, r.Stderr, "relay migrate: database")
	require.Empty(t, r.Stdout)

	r = runRelay(t, time.Minute, unreachable, "migrate", "status", "--log-format=json")
	require.Equal(t, 1, r.Code, r.Stderr)
	lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
	require.Len(t, lines, 1, r.Stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &rec), lines[0])
	require.Equal(t, "ERROR", rec["level"])

	db := testdb.Empty(t) // migrations not run
	r = runRelay(t, time.Minute, []string{"DATABASE_URL=" + db.URL}, "status")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Len(t, strings.Split(strings.TrimSpace(r.Stderr), "\n"), 1, r.Stderr)
	require.Contains(t, r.Stderr, "migrate up")
}

func TestUsageMistakesOneLine(t *testing.T) {
	t.Parallel()
	db := []string{"DATABASE_URL=postgres://u@127.0.0.1:1/db"}
	for _, args := range [][]string{{"frobnicate"}, {"status", "--no-such-flag"}, {"migrate"}, {"migrate", "sideways"}, {"status", "extra"}} {
		r := runRelay(t, time.Minute, db, args...)
		require.Equal(t, 2, r.Code, "%v: %s", args, r.Stderr)
		require.Len(t, strings.Split(strings.TrimSpace(r.Stderr), "\n"), 1, "%v: %s", args, r.Stderr)
	}
}

// --- helpers ---

func with(set setFn, v string, env []string, args ...string) ([]string, []string) {
	a, e := set(v)
	return append(append([]string{}, args...), a...), append(append([]string{}, env...), e...)
}

func runWith(t *testing.T, set setFn, v string, env []string, args ...string) result {
	t.Helper()
	a, e := with(set, v, env, args...)
	return runRelay(t, 2*time.Minute, e, a...)
}

func kafkaEnv(c *kfake.Cluster) string {
	return "KAFKA_BROKERS=" + strings.Join(c.ListenAddrs(), ",")
}

// ordersFixture: a database with two "orders" inbox keys (2h and 1h old) and
// a broker whose "orders" topic keeps 1h with 10m segments.
func ordersFixture(t *testing.T, opts ...kfake.Opt) (*testdb.DB, *kfake.Cluster) {
	t.Helper()
	db := testdb.New(t)
	c := kafkatest.New(t, opts...)
	seedInbox(t, db, "svc", "orders", 2*time.Hour, time.Hour)
	return db, c
}

func createOrders(t *testing.T, c *kfake.Cluster) {
	t.Helper()
	hour, tenMin := "3600000", "600000"
	kafkatest.CreateTopic(t, c.ListenAddrs(), "orders", 1, map[string]*string{"retention.ms": &hour, "segment.ms": &tenMin})
}

// requireReached: the cleanup report shows what Kafka said of "orders".
func requireReached(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.Code, r.Stderr)
	row := reportRow(t, r.Stdout, "orders")
	require.Equal(t, []string{"orders", "1h", "10m", "delete"}, row[:4], r.Stdout)
}

func requireUnreached(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "not pruned this pass: "+string(cleanup.ReasonKafkaUnreachable), r.Stdout)
}

// probe is a listener that records the first bytes a Kafka client sends
// and then closes the connection (or, silent, never answers).
type probe struct {
	addr  string
	first chan []byte
}

func newProbe(t *testing.T, silent bool) *probe {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	p := &probe{addr: ln.Addr().String(), first: make(chan []byte, 16)}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 512)
				_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				n, _ := io.ReadAtLeast(conn, buf, 14)
				select {
				case p.first <- buf[:n]:
				default:
				}
				if silent {
					_, _ = io.Copy(io.Discard, conn)
				}
			}()
		}
	}()
	return p
}

// request parses a Kafka request header: api key and version, client id.
func (p *probe) request(t *testing.T) (apiKey, apiVersion int16, clientID string, raw []byte) {
	t.Helper()
	select {
	case b := <-p.first:
		require.GreaterOrEqual(t, len(b), 14)
		raw = b
		apiKey, apiVersion = int16(binary.BigEndian.Uint16(b[4:])), int16(binary.BigEndian.Uint16(b[6:]))
		n := int(int16(binary.BigEndian.Uint16(b[12:])))
		if n > 0 && 14+n <= len(b) {
			clientID = string(b[14 : 14+n])
		}
		return apiKey, apiVersion, clientID, raw
	case <-time.After(time.Minute):
		t.Fatal("no connection reached the probe")
	}
	return 0, 0, "", nil
}

func probeCleanup(t *testing.T, set setFn, v string, env ...string) *probe {
	t.Helper()
	p := newProbe(t, false)
	db := testdb.New(t)
	seedInbox(t, db, "svc", "orders", time.Hour)
	r := runWith(t, set, v, append([]string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + p.addr, "PGBOX_KAFKA_TIMEOUT=2s"}, env...), "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	return p
}

// --- Database ---

func checkDatabaseURL(t *testing.T, set setFn) {
	db := testdb.New(t)
	r := runWith(t, set, db.URL, nil, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "00001_inbox.sql")
	require.NotContains(t, r.Stdout, "pending", "the test schema is migrated: the URL was used")
}

func checkSchema(t *testing.T, set setFn) {
	db := testdb.Empty(t)
	r := runWith(t, set, db.Schema, []string{"DATABASE_URL=" + testdb.ServerURL(t)}, "migrate", "up")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.True(t, tableExists(t, db, "pgbox_outbox"), "tables are created in --schema")
}

func checkDBMaxConns(t *testing.T, set setFn) {
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(3, "payments"))
	writeRows(t, db, "payments", 0, 300)
	app := fmt.Sprintf("pgbox-maxconns-%d", time.Now().UnixNano())
	a, e := with(set, "2", runEnv(db, c, "PGBOX_LANES=16", "PGBOX_BATCH_SIZE=5"), "run")
	e = append(e, "DATABASE_URL="+db.URL+"&application_name="+app)
	p := startRelay(t, e, a...)
	p.HTTPAddr(t)
	most := 0
	waitFor(t, "outbox drained", 90*time.Second, func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		most = max(most, n)
		return outboxCount(t, db) == 0
	})
	require.Positive(t, most, "the DSN's application_name is kept")
	require.LessOrEqual(t, most, 3, "2 pooled connections + the LISTEN connection")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// --- Kafka ---

func checkKafkaBrokers(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	createOrders(t, c)
	requireReached(t, runWith(t, set, strings.Join(c.ListenAddrs(), ","), []string{"DATABASE_URL=" + db.URL}, "cleanup", "--dry-run"))
}

func checkKafkaVersion(t *testing.T, set setFn) {
	// Sarama opens with ApiVersions (key 18): version 4 from Kafka 3.9, 3
	// before.
	key, v, _, _ := probeCleanup(t, set, "3.9.0").request(t)
	require.Equal(t, [2]int16{18, 4}, [2]int16{key, v})
	key, v, _, _ = probeCleanup(t, set, "3.6.0").request(t)
	require.Equal(t, [2]int16{18, 3}, [2]int16{key, v})
}

func checkKafkaClientID(t *testing.T, set setFn) {
	_, _, id, _ := probeCleanup(t, set, "ledger-relay-7").request(t)
	require.Equal(t, "ledger-relay-7", id)
}

func checkKafkaTimeout(t *testing.T, set setFn) {
	p := newProbe(t, true) // accepts, never answers
	db := testdb.New(t)
	seedInbox(t, db, "svc", "orders", time.Hour)
	start := time.Now()
	r := runWith(t, set, "1s", []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=" + p.addr}, "cleanup", "--dry-run")
	requireUnreached(t, r)
	require.Less(t, time.Since(start), 9*time.Second, "the pass waits --kafka-timeout, not the 10s default")
}

func checkSASL(which string) func(t *testing.T, set setFn) {
	return func(t *testing.T, set setFn) {
		const mech, user, pass = "SCRAM-SHA-256", "alice", "s3cret-pw"
		db, c := ordersFixture(t, kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
		env := []string{"DATABASE_URL=" + db.URL, kafkaEnv(c), "PGBOX_KAFKA_SASL_MECHANISM=" + mech, "PGBOX_KAFKA_SASL_USER=" + user, "PGBOX_KAFKA_SASL_PASSWORD=" + pass}
		right := map[string]string{"mechanism": mech, "user": user, "password": pass}[which]
		wrong := map[string]string{"mechanism": "SCRAM-SHA-512", "user": "mallory", "password": "wr0ng"}[which]
		r := runWith(t, set, wrong, env, "cleanup", "--dry-run")
		requireUnreached(t, r)
		require.NotContains(t, r.Stdout+r.Stderr, pass)
		r = runWith(t, set, right, env, "cleanup", "--dry-run")
		require.Equal(t, 0, r.Code, r.Stderr)
		row := reportRow(t, r.Stdout, "orders")
		require.NotContains(t, strings.Join(row, " "), "unreachable", r.Stdout)
	}
}

func checkKafkaTLS(t *testing.T, set setFn) {
	_, _, _, raw := probeCleanup(t, set, "true").request(t)
	require.Equal(t, byte(0x16), raw[0], "a TLS handshake record")
	_, _, _, raw = probeCleanup(t, set, "false").request(t)
	require.NotEqual(t, byte(0x16), raw[0])
}

func checkTLSFile(which string) func(t *testing.T, set setFn) {
	return func(t *testing.T, set setFn) {
		pki := kafkatest.NewPKI(t)
		db, c := ordersFixture(t, kfake.TLS(pki.ServerTLS))
		files := map[string]string{"ca": pki.CAFile, "cert": pki.CertFile, "key": pki.KeyFile}
		env := []string{"DATABASE_URL=" + db.URL, kafkaEnv(c)}
		for k, f := range files {
			if k != which {
				env = append(env, "PGBOX_KAFKA_TLS_"+strings.ToUpper(k)+"="+f)
			}
		}
		r := runWith(t, set, files[which], env, "cleanup", "--dry-run")
		require.Equal(t, 0, r.Code, r.Stderr)
		require.NotContains(t, r.Stdout, "unreachable", "TLS with %s from the setting connects: %s", which, r.Stdout)
	}
}

func checkTLSSkipVerify(t *testing.T, set setFn) {
	pki := kafkatest.NewPKI(t)
	srv := pki.ServerTLS.Clone()
	srv.ClientAuth = tls.NoClientCert
	db, c := ordersFixture(t, kfake.TLS(srv))
	env := []string{"DATABASE_URL=" + db.URL, kafkaEnv(c), "PGBOX_KAFKA_TLS=true"}
	requireUnreached(t, runWith(t, set, "false", env, "cleanup", "--dry-run"))
	r := runWith(t, set, "true", env, "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stdout, "unreachable", r.Stdout)
}

// --- Relay ---

type laneRow struct {
	owner   string
	expires time.Time
}

func lanes(t *testing.T, db *testdb.DB) []laneRow {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT coalesce(owner, ''), expires_at FROM pgbox_relay_lanes ORDER BY lane`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (laneRow, error) {
		var l laneRow
		return l, r.Scan(&l.owner, &l.expires)
	})
	require.NoError(t, err)
	return out
}

func startWith(t *testing.T, set setFn, v string, env []string) (*proc, string) {
	t.Helper()
	a, e := with(set, v, env, "run")
	p := startRelay(t, e, a...)
	return p, "http://" + p.HTTPAddr(t)
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	waitFor(t, "ready", time.Minute, func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 })
}

func checkLanes(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	p, base := startWith(t, set, "3", runEnv(db, c))
	waitReady(t, base)
	_, body := httpGet(t, base+"/readyz")
	require.Contains(t, body, "holding 3 of 3")
	require.Len(t, lanes(t, db), 3)
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkInstance(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	p, base := startWith(t, set, "relay-eu-1", runEnv(db, c))
	waitReady(t, base)
	for _, l := range lanes(t, db) {
		require.True(t, strings.HasPrefix(l.owner, "relay-eu-1#"), "owner %q", l.owner)
	}
	require.Equal(t, 0, p.stop(t), p.Output())
}

func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	_, m := httpGet(t, base+"/metrics")
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`)
	sm := re.FindStringSubmatch(m)
	if sm == nil {
		return -1
	}
	var v float64
	_, err := fmt.Sscan(sm[1], &v)
	require.NoError(t, err)
	return v
}

func checkBatchSize(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t, kfake.SeedTopics(1, "payments"))
	writeRows(t, db, "payments", 0, 40)
	p, base := startWith(t, set, "10", runEnv(db, c, "PGBOX_LANES=1"))
	waitFor(t, "drained", time.Minute, func() bool { return outboxCount(t, db) == 0 })
	waitFor(t, "published metric", 30*time.Second, func() bool { return metricValue(t, base, "pgbox_relay_published_total") == 40 })
	require.GreaterOrEqual(t, metricValue(t, base, "pgbox_relay_batches_total"), 4.0, "40 rows in batches of at most 10")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// notifyRow commits one row whose writer notifies channel.
func notifyRow(t *testing.T, db *testdb.DB, channel string) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Notify: true, Channel: channel})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return w.Write(ctx, tx, outbox.Message{Topic: "payments", Key: []byte("k"), Value: []byte("v")})
	}))
}

// idleRelay starts a relay with the setting and extra env and waits until it
// holds its lanes and the outbox is empty.
func idleRelay(t *testing.T, set setFn, v string, extra ...string) (*testdb.DB, *proc) {
	t.Helper()
	db, c := testdb.New(t), kafkatest.New(t, kfake.SeedTopics(1, "payments"))
	env := runEnv(db, c, extra...)
	p, base := startWith(t, set, v, env)
	waitReady(t, base)
	time.Sleep(time.Second) // past the first passes
	return db, p
}

func requireStaysFor(t *testing.T, db *testdb.DB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		require.Equal(t, 1, outboxCount(t, db), "the row was published though nothing should wake the relay")
		time.Sleep(100 * time.Millisecond)
	}
}

func checkPollInterval(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "1h", "PGBOX_NO_LISTEN=true")
	writeRows(t, db, "payments", 0, 1)
	requireStaysFor(t, db, 3*time.Second)
	require.Equal(t, 0, p.stop(t), p.Output())

	db, p = idleRelay(t, set, "200ms", "PGBOX_NO_LISTEN=true")
	writeRows(t, db, "payments", 0, 1)
	waitFor(t, "published by polling", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkNoListen(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "true", "PGBOX_POLL_INTERVAL=1h")
	notifyRow(t, db, outbox.ChannelDefault)
	requireStaysFor(t, db, 3*time.Second)
	require.Equal(t, 0, p.stop(t), p.Output())

	db, p = idleRelay(t, set, "false", "PGBOX_POLL_INTERVAL=1h")
	notifyRow(t, db, outbox.ChannelDefault)
	waitFor(t, "published on NOTIFY", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkChannel(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "ledger_outbox", "PGBOX_POLL_INTERVAL=1h")
	notifyRow(t, db, outbox.ChannelDefault)
	requireStaysFor(t, db, 3*time.Second)
	notifyRow(t, db, "ledger_outbox")
	waitFor(t, "published on NOTIFY ledger_outbox", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkHeartbeat(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "300ms", "PGBOX_LEASE_TTL=1h")
	seen := map[time.Time]bool{}
	for range 30 {
		var at time.Time
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT max(heartbeat_at) FROM pgbox_relay_instances`).Scan(&at))
		seen[at] = true
		time.Sleep(100 * time.Millisecond)
	}
	require.GreaterOrEqual(t, len(seen), 4, "a heartbeat every 300ms for 3s (the default is 2s)")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkLeaseTTL(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "1h")
	for _, l := range lanes(t, db) {
		require.Greater(t, time.Until(l.expires), 50*time.Minute, "lanes are leased for --lease-ttl")
	}
	require.Equal(t, 0, p.stop(t), p.Output())
}

func parkedAttempts(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var n int
	err := db.Pool.QueryRow(context.Background(), `SELECT attempts FROM pgbox_outbox WHERE parked_at IS NOT NULL`).Scan(&n)
	if err == pgx.ErrNoRows {
		return -1
	}
	require.NoError(t, err)
	return n
}

func checkMaxAttempts(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "2", "PGBOX_MAX_BACKOFF=200ms", "PGBOX_UNKNOWN_TOPIC_WINDOW=0s")
	writeRows(t, db, "no-such-topic", 0, 1)
	waitFor(t, "parked", time.Minute, func() bool { return parkedAttempts(t, db) >= 0 })
	require.Equal(t, 2, parkedAttempts(t, db))
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkMaxBackoff(t *testing.T, set setFn) {
	// 20 failed attempts: with a 200ms cap they take seconds; with the 10s
	// default, minutes.
	db, p := idleRelay(t, set, "200ms", "PGBOX_MAX_ATTEMPTS=20", "PGBOX_UNKNOWN_TOPIC_WINDOW=0s")
	writeRows(t, db, "no-such-topic", 0, 1)
	waitFor(t, "parked within 45s", 45*time.Second, func() bool { return parkedAttempts(t, db) == 20 })
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkUnknownTopicWindow(t *testing.T, set setFn) {
	// A missing topic is retried for the window, not MaxAttempts times: with
	// 1000 attempts allowed the row is parked within seconds of a 2s window
	// (with the 5m default, not for minutes).
	db, p := idleRelay(t, set, "2s", "PGBOX_MAX_ATTEMPTS=1000", "PGBOX_MAX_BACKOFF=200ms")
	writeRows(t, db, "no-such-topic", 0, 1)
	waitFor(t, "parked within 45s", 45*time.Second, func() bool { return parkedAttempts(t, db) >= 0 })
	require.Less(t, parkedAttempts(t, db), 1000)
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkKafkaOutageAlert(t *testing.T, set setFn) {
	// Kafka unreachable from the start: logged at ERROR after 1s (with the
	// 1m default, not within the test's 30s).
	db := testdb.New(t)
	p, _ := startWith(t, set, "1s", append(runEnv(db, kafkatest.New(t)), "KAFKA_BROKERS=127.0.0.1:1"))
	waitFor(t, "the outage logged at ERROR", 30*time.Second, func() bool {
		return strings.Contains(p.Output(), `level=ERROR msg="Kafka unreachable"`)
	})
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkSweepInterval(t *testing.T, set setFn) {
	// The sweep looks below the owned slots' floors every interval (a debug
	// line each time it finds nothing): at 1s, several times within
	// seconds; with the 1m default, once at start. (A row below a floor is
	// what the sweep is for; no writer can put one there any more: relay's
	// TestFloorSweepCatchesABrokenRule breaks the rule on purpose.)
	db := testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(1, "sweep.v1"))
	p, _ := startWith(t, set, "1s", runEnv(db, c, "PGBOX_LOG_LEVEL=debug"))
	for i := range 3 {
		writeRows(t, db, "sweep.v1", i*20, 20)
		waitFor(t, "published", 30*time.Second, func() bool { return outboxCount(t, db) == 0 })
	}
	waitFor(t, "the sweep's look, every second", 30*time.Second, func() bool {
		return strings.Count(p.Output(), "the sweep looked below the floors: nothing there") >= 3
	})
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkPartitioner(t *testing.T, set setFn) {
	for name, part := range map[string]sarama.PartitionerConstructor{"fnv1a": sarama.NewHashPartitioner, "murmur2": relay.NewMurmur2Partitioner} {
		db, c := testdb.New(t), kafkatest.New(t)
		kafkatest.CreateTopic(t, c.ListenAddrs(), "payments", 8, nil)
		writeRows(t, db, "payments", 0, 7) // keys k0..k6
		a, e := with(set, name, runEnv(db, c), "run")
		p := startRelay(t, e, a...)
		p.HTTPAddr(t)
		recs := kafkatest.ReadAll(t, c.ListenAddrs(), "payments", 7, time.Minute)
		pt := part("payments")
		for _, r := range recs {
			want, err := pt.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(r.Key)}, 8)
			require.NoError(t, err)
			require.Equal(t, want, r.Partition, "%s: key %s", name, r.Key)
		}
		require.Equal(t, 0, p.stop(t), p.Output())
	}
}

func checkMaxMessageBytes(t *testing.T, set setFn) {
	db, p := idleRelay(t, set, "2048", "PGBOX_MAX_ATTEMPTS=1")
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx, outbox.Message{Topic: "payments", Key: []byte("big"), Value: make([]byte, 3000)})
	}))
	waitFor(t, "the 3000-byte row parked", time.Minute, func() bool { return parkedAttempts(t, db) >= 0 })
	writeRows(t, db, "payments", 0, 1)
	waitFor(t, "the small row published", time.Minute, func() bool { return outboxCount(t, db) == 1 })
	require.Equal(t, 0, p.stop(t), p.Output())
}

// --- Cleanup ---

func checkCleanupInterval(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	p, base := startWith(t, set, "300ms", runEnv(db, c))
	waitFor(t, "several cleanup passes", time.Minute, func() bool { return metricValue(t, base, "pgbox_cleanup_passes_total") >= 3 })
	require.Equal(t, 0, p.stop(t), p.Output())

	p, base = startWith(t, set, "0s", runEnv(db, c))
	waitReady(t, base)
	require.Equal(t, -1.0, metricValue(t, base, "pgbox_cleanup_passes_total"), "0 disables cleanup in this process")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func cleanupEnv(db *testdb.DB, c *kfake.Cluster) []string {
	return []string{"DATABASE_URL=" + db.URL, kafkaEnv(c)}
}

func checkCleanupBuffer(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	createOrders(t, c)
	r := runWith(t, set, "30m", cleanupEnv(db, c), "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, "1h40m", reportRow(t, r.Stdout, "orders")[4], r.Stdout)
}

func checkCleanupWindow(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	compact := "compact"
	kafkatest.CreateTopic(t, c.ListenAddrs(), "orders", 1, map[string]*string{"cleanup.policy": &compact})
	r := runWith(t, set, "90m", cleanupEnv(db, c), "cleanup", "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	row := reportRow(t, r.Stdout, "orders")
	require.Equal(t, []string{"1h30m", "1"}, row[4:6], r.Stdout)
	require.Contains(t, r.Stdout, "forced window")
}

func passLine(t *testing.T, out string) (took time.Duration, batches int) {
	t.Helper()
	m := regexp.MustCompile(`took (\S+): .* in (\d+) batches`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	took, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	_, err = fmt.Sscan(m[2], &batches)
	require.NoError(t, err)
	return took, batches
}

func checkCleanupBatchSize(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	createOrders(t, c)
	seedInbox(t, db, "svc", "orders", 5*time.Hour, 6*time.Hour, 7*time.Hour, 8*time.Hour)
	r := runWith(t, set, "2", append(cleanupEnv(db, c), "PGBOX_CLEANUP_BUFFER=1m"), "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "5 rows deleted")
	_, batches := passLine(t, r.Stdout)
	require.GreaterOrEqual(t, batches, 3, "5 keys, at most 2 per batch: %s", r.Stdout)
}

func checkCleanupPause(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	createOrders(t, c)
	seedInbox(t, db, "svc", "orders", 5*time.Hour, 6*time.Hour)
	r := runWith(t, set, "1s", append(cleanupEnv(db, c), "PGBOX_CLEANUP_BUFFER=1m", "PGBOX_CLEANUP_BATCH_SIZE=1"), "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "3 rows deleted")
	took, _ := passLine(t, r.Stdout)
	require.GreaterOrEqual(t, took, 2*time.Second, "3 batches of one key, 1s pause between them: %s", r.Stdout)
}

func checkKeep(name, table string) func(t *testing.T, set setFn) {
	return func(t *testing.T, set setFn) {
		db, c := ordersFixture(t)
		createOrders(t, c)
		r := runWith(t, set, "50h", cleanupEnv(db, c), "cleanup", "--dry-run")
		require.Equal(t, 0, r.Code, r.Stderr)
		var row []string
		for _, line := range strings.Split(r.Stdout, "\n") {
			if strings.HasPrefix(line, table+" ") {
				row = strings.Fields(strings.TrimPrefix(line, table))
			}
		}
		require.NotNil(t, row, "no %s row: %s", table, r.Stdout)
		require.Equal(t, "2d2h", row[0], "--%s 50h: %s", name, r.Stdout)
		if name == "keep-parked" {
			r = runWith(t, set, "forever", cleanupEnv(db, c), "cleanup", "--dry-run")
			require.Equal(t, 0, r.Code, r.Stderr)
			require.NotContains(t, r.Stdout, table, "forever: parked rows are not pruned")
		}
	}
}

func checkDryRun(t *testing.T, set setFn) {
	db, c := ordersFixture(t)
	createOrders(t, c)
	env := append(cleanupEnv(db, c), "PGBOX_CLEANUP_BUFFER=1m")
	r := runWith(t, set, "true", env, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stdout, "would delete 1 rows (1 inbox keys, 0 other rows)", "the dry run prints its totals")
	require.Regexp(t, `(?m)^TOTAL\s+1\s+0\s+1\s*$`, r.Stdout, "total, by exact rule, by time rule")
	require.Equal(t, 2, inboxKeys(t, db))
	r = runWith(t, set, "false", env, "cleanup")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Equal(t, 1, inboxKeys(t, db))
}

// --- HTTP, status, process ---

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func checkHTTPAddr(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	addr := freeAddr(t)
	p, base := startWith(t, set, addr, runEnv(db, c))
	require.Equal(t, "http://"+addr, base)
	code, _ := httpGet(t, base+"/healthz")
	require.Equal(t, 200, code)
	require.Equal(t, 0, p.stop(t), p.Output())

	a, e := with(set, "", runEnv(db, c), "run")
	p = startRelay(t, e, a...)
	waitFor(t, "relay running", time.Minute, func() bool { return strings.Contains(p.Output(), "relay running") })
	require.NotContains(t, p.Output(), "http listening", "empty: no HTTP server")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkJSON(t *testing.T, set setFn) {
	db := testdb.New(t)
	r := runWith(t, set, "true", []string{"DATABASE_URL=" + db.URL}, "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Stdout), &m), r.Stdout)
}

func checkLogFormat(t *testing.T, set setFn) {
	db := testdb.New(t)
	r := runWith(t, set, "json", []string{"DATABASE_URL=" + db.URL, "PGBOX_LOG_LEVEL=debug"}, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
	require.NotEmpty(t, lines[0])
	for _, l := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
	}
}

func checkLogLevel(t *testing.T, set setFn) {
	db := testdb.New(t)
	env := []string{"DATABASE_URL=" + db.URL}
	r := runWith(t, set, "debug", env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "level=DEBUG")
	r = runWith(t, set, "info", env, "migrate", "status")
	require.Equal(t, 0, r.Code, r.Stderr)
	require.NotContains(t, r.Stderr, "level=DEBUG")
}

func checkShutdownTimeout(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	p, _ := startWith(t, set, "7s", runEnv(db, c))
	require.Equal(t, 0, p.stop(t), p.Output())
	require.Contains(t, p.Output(), "shutdown_timeout=7s", "the effective setting is logged at start")
	require.Contains(t, p.Output(), `msg="shutting down" deadline=7s`)
}
