package integration_test

// The environment tests' world: a private database per test (reachable
// directly and through pgbouncer), an embedded broker, and the whole chain
// run in-process through the library API:
//
//	writers ──outbox.Write──► relays ──► "orders" ──► payments consumers
//	  (orders rows)                                    (inbox dedup, payments
//	                                                    rows, outbox.Write)
//	                                    relays ──► "payments" ──► verifier
//
// Every event carries its key and a per-key sequence number, so the verifier
// can check that each one took effect once and in order.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for migrations
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

const (
	ordersTopic   = "orders"
	paymentsTopic = "payments"
	paymentsGroup = "payments-svc"
	seqHeader     = "seq"
)

// checkLeaks fails t if goroutines started during it outlive its cleanups.
// Registered first, it runs last, after the pools and brokers closed. (Per
// test rather than in TestMain, so the chaos harness' TestMain merges freely.)
func checkLeaks(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		// sarama's metrics registry starts one global ticker, forever.
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// repoRoot is the checkout's root (this file's directory's parent).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Dir(filepath.Dir(file))
}

var pgbouncerOnce struct {
	sync.Once
	url string
	err error
}

// pgbouncerURL returns PGBOX_PGBOUNCER_URL (set by the Makefile's matrix
// target), or else provisions a private pgbouncer in front of DATABASE_URL's
// server with scripts/pgbouncer.sh (installing Debian's package when missing
// and root), so a plain `go test` covers pgbouncer too. It fails the test,
// never skips it, when no pgbouncer can be had.
func pgbouncerURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("PGBOX_PGBOUNCER_URL"); u != "" {
		return u
	}
	server := testdb.ServerURL(t)
	pgbouncerOnce.Do(func() {
		cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "pgbouncer.sh"), "url")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+server)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			pgbouncerOnce.err = fmt.Errorf("scripts/pgbouncer.sh url: %w\n%s", err, stderr.String())
			return
		}
		pgbouncerOnce.url = strings.TrimSpace(string(out))
	})
	if pgbouncerOnce.err != nil {
		t.Fatalf("no pgbouncer: %v (set PGBOX_PGBOUNCER_URL to a pgbouncer in transaction pool mode in front of DATABASE_URL's server)", pgbouncerOnce.err)
	}
	return pgbouncerOnce.url
}

// withDatabase returns rawURL pointing at database name.
func withDatabase(t testing.TB, rawURL, name string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// withParam returns rawURL with query parameter k set to v.
func withParam(t testing.TB, rawURL, k, v string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// newDatabase creates a private database on DATABASE_URL's server, with
// pgbox's migrations applied (in its public schema, directly: migrations take
// a session advisory lock, so they run on a direct connection, not through
// pgbouncer) and the business tables of the chain, and returns its name and
// direct URL. It is dropped when the test ends. A database rather than a
// schema, because pgbouncer does not pass a search_path startup parameter on.
func newDatabase(t testing.TB) (name, direct string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, direct = testdb.CreateDatabase(t, "pgbox_it_")
	sqlDB, err := sql.Open("pgx", direct)
	require.NoError(t, err)
	defer sqlDB.Close()
	require.NoError(t, migrations.Up(ctx, sqlDB))
	_, err = sqlDB.ExecContext(ctx, `
		CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL, seq int NOT NULL);
		-- no unique constraint: a duplicate effect shows as a second row
		CREATE TABLE payments (id bigserial PRIMARY KEY, event_id text NOT NULL, key text NOT NULL, seq int NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
	return name, direct
}

// newPool opens a pool on rawURL, closed when the test ends.
func newPool(t testing.TB, rawURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(rawURL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newBroker starts an embedded broker with the chain's two topics (4
// partitions each, with a finite retention so cleanup has a window).
func newBroker(t testing.TB) []string {
	t.Helper()
	c := kafkatest.New(t, kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	addrs := c.ListenAddrs()
	minute := "60000"
	for _, topic := range []string{ordersTopic, paymentsTopic} {
		kafkatest.CreateTopic(t, addrs, topic, 4, map[string]*string{"retention.ms": &minute, "segment.ms": &minute})
	}
	return addrs
}

// chain runs the parts of the chain against one database and broker.
type chain struct {
	t      *testing.T
	pool   *pgxpool.Pool // the pool writers use (direct or through pgbouncer)
	direct *pgxpool.Pool // for the verifier only
	url    string        // the URL every pgbox part connects with
	addrs  []string
	wg     sync.WaitGroup
}

func newChain(t *testing.T, partsURL, directURL string, addrs []string) *chain {
	c := &chain{t: t, url: partsURL, addrs: addrs}
	c.pool = newPool(t, partsURL, 8)
	c.direct = newPool(t, directURL, 4)
	return c
}

// write commits events from..to (sequence numbers) for each of keys keys,
// one transaction per event (an orders row and its outbox row), one writer
// per key, so each key's events commit in sequence order; pace is slept
// between two events of a key.
func (c *chain) write(ctx context.Context, keys, from, to int, pace time.Duration) error {
	errs := make(chan error, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			key := fmt.Sprintf("acct-%03d", k)
			for seq := from; seq <= to; seq++ {
				if err := c.writeOne(ctx, key, seq); err != nil {
					errs <- fmt.Errorf("write %s seq %d: %w", key, seq, err)
					return
				}
				time.Sleep(pace)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (c *chain) writeOne(ctx context.Context, key string, seq int) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (key, seq) VALUES ($1, $2)`, key, seq); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, event(ordersTopic, key, seq))
	})
}

func event(topic, key string, seq int) outbox.Message {
	s := strconv.Itoa(seq)
	return outbox.Message{Topic: topic, Key: []byte(key), Value: []byte(key + ":" + s),
		Headers: []outbox.Header{{Key: seqHeader, Value: []byte(s)}}}
}

// startRelay runs a relay with its own pool until the test ends. Polling
// only (NoListen): LISTEN needs a session, which transaction pooling has not.
func (c *chain) startRelay(ctx context.Context, name string) *relay.Relay {
	t := c.t
	k := relay.NewKafkaConfig()
	k.Version = kafkatest.Version
	k.Metadata.Retry.Backoff = 50 * time.Millisecond
	k.Producer.Retry.Backoff = 50 * time.Millisecond
	r, err := relay.New(relay.Config{Pool: newPool(t, c.url, 4), Brokers: c.addrs, Kafka: k, Instance: name,
		NoListen: true, PollInterval: 100 * time.Millisecond, Lanes: 8})
	require.NoError(t, err)
	c.wg.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("relay %s: %v", name, err)
		}
	})
	return r
}

// pay is the payments service's handler: one payments row per event, and an
// event of its own to the payments topic, in the consumer's transaction.
func pay(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	id, _ := m.Header(relay.EventIDHeader)
	s, _ := m.Header(seqHeader)
	seq, err := strconv.Atoi(string(s))
	if err != nil {
		return inbox.Permanent(fmt.Errorf("event %s: bad seq header %q", id, s))
	}
	key := string(m.Key)
	if _, err := tx.Exec(ctx, `INSERT INTO payments (event_id, key, seq) VALUES ($1, $2, $3)`, string(id), key, seq); err != nil {
		return err
	}
	return outbox.Write(ctx, tx, event(paymentsTopic, key, seq))
}

// startConsumer runs one member of group with its own pool until the test
// ends, deduplicating through the inbox of consumer "payments".
func (c *chain) startConsumer(ctx context.Context, group string, batch int) *inboxsarama.Handler {
	t := c.t
	ib, err := inbox.New(inbox.Config{Consumer: "payments", Key: inbox.ByHeader(relay.EventIDHeader)})
	require.NoError(t, err)
	h, err := inboxsarama.NewHandler(newPool(t, c.url, 4), ib, pay, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch}})
	require.NoError(t, err)
	cfg := kafkatest.Config()
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	g, err := sarama.NewConsumerGroup(c.addrs, group, cfg)
	require.NoError(t, err)
	c.wg.Go(func() {
		defer g.Close()
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{ordersTopic}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) && ctx.Err() == nil {
				t.Logf("consumer group %s: %v", group, err)
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	return h
}

// waitFor polls cond every 200ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *chain) count(q string, args ...any) int {
	var n int
	require.NoError(c.t, c.direct.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// waitPaid waits until every one of total events has its payment and the
// outbox is empty (the payments events published too).
func (c *chain) waitPaid(total int, timeout time.Duration) {
	waitFor(c.t, timeout, "every event paid and published", func() (bool, string) {
		paid := c.count(`SELECT count(DISTINCT event_id) FROM payments`)
		backlog := c.count(`SELECT count(*) FROM pgbox_outbox`)
		return paid == total && backlog == 0, fmt.Sprintf("paid %d of %d, outbox %d rows", paid, total, backlog)
	})
}

// verify checks the guarantees end to end: no duplicate business effect,
// per-key order of the effects, and every payments event in Kafka, in
// per-key order (duplicate records are allowed and logged).
func (c *chain) verify(keys, perKey int) {
	t := c.t
	total := keys * perKey
	require.Equal(t, total, c.count(`SELECT count(*) FROM payments`), "duplicate business effects")
	require.Equal(t, total, c.count(`SELECT count(DISTINCT (key, seq)) FROM payments`), "events lost or paid under another event id")
	require.Equal(t, 0, c.count(`SELECT count(*) FROM (
		SELECT seq < lag(seq) OVER (PARTITION BY key ORDER BY id) AS inverted FROM payments) s WHERE inverted`),
		"payments of one key applied out of order")

	recs := kafkatest.ReadAll(t, c.addrs, paymentsTopic, total, 2*time.Minute)
	next := map[string]int{}
	dups := 0
	for _, r := range recs {
		key := string(r.Key)
		seq, err := strconv.Atoi(strings.TrimPrefix(string(r.Value), key+":"))
		require.NoError(t, err, "record %s/%d@%d", r.Topic, r.Partition, r.Offset)
		switch {
		case seq == next[key]+1:
			next[key] = seq
		case seq <= next[key]:
			dups++ // a redelivery of an earlier one (allowed)
		default:
			t.Fatalf("key %s: seq %d at %s/%d@%d, want %d next: a record lost or out of order",
				key, seq, r.Topic, r.Partition, r.Offset, next[key]+1)
		}
	}
	for k := range keys {
		key := fmt.Sprintf("acct-%03d", k)
		require.Equal(t, perKey, next[key], "key %s: records missing from %s", key, paymentsTopic)
	}
	t.Logf("verified %d events over %d keys: %d payments, %d Kafka records (%d duplicates)", total, keys, total, len(recs), dups)
}
