package relay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/delayproxy"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// Drain benchmark shape (issue 14): a backlog of 200k rows of 200 B values
// on a topic of 6 partitions.
const (
	drainRows       = 200_000
	drainValueBytes = 200
	drainPartitions = 6
	drainBatch      = 500 // the baseline's batch
)

// BenchmarkDrain: how fast a full backlog reaches Kafka. Each run starts
// from a fresh schema holding the whole backlog (committed, vacuumed) and a
// fresh broker, with nothing running; the clock starts when the relay (or
// the baseline) starts and stops when the topic's end offsets, read by a
// separate client, add up to the backlog. Start-up (producer id, metadata,
// lanes) is on the clock.
//
// baseline is the hand-written loop a team would write without pgbox:
// BEGIN; DELETE ... WHERE id IN (SELECT id ... ORDER BY id LIMIT 500 FOR
// UPDATE SKIP LOCKED) RETURNING ...; one SendMessages of the 500; COMMIT.
// It keeps no per-key order when a send fails midway (sarama fails one
// record and delivers the next when a leader is missing), pgbox does.
//
// The sides alternate run by run (the order flipping each time) so bursts
// of other work on a shared machine hit both alike; the benchmark reports
// both rates and their ratio (x-baseline). Key shapes: 1,000 keys, every
// key unique, 10 hot keys.
//
// With PGBOX_BENCH_DELAY (make bench-remote) both sides reach PostgreSQL
// through a proxy delaying each direction.
//
//	make bench PKG=./relay/... BENCH=Drain BENCHTIME=3x
func BenchmarkDrain(b *testing.B) {
	for _, keys := range []int{1000, 0, 10} {
		name := "keys=" + strconv.Itoa(keys)
		if keys == 0 {
			name = "keys=unique"
		}
		b.Run(name, func(b *testing.B) {
			var tp, tb time.Duration
			for i := range b.N {
				if i%2 == 0 {
					tp += drainOnce(b, keys, drainPgbox)
					tb += drainOnce(b, keys, drainBaseline)
				} else {
					tb += drainOnce(b, keys, drainBaseline)
					tp += drainOnce(b, keys, drainPgbox)
				}
			}
			n := float64(b.N * drainRows)
			b.ReportMetric(n/tp.Seconds(), "pgbox-msgs/s")
			b.ReportMetric(n/tb.Seconds(), "baseline-msgs/s")
			b.ReportMetric(tb.Seconds()/tp.Seconds(), "x-baseline")
		})
	}
}

// drainSide starts draining tb's outbox to Kafka and returns a func that
// stops it (off the clock).
type drainSide func(b *testing.B, tb *testBundle, pool *pgxpool.Pool) (stop func())

// drainOnce prepares a full backlog with nothing running, then times side
// from its start until every record is on Kafka as a separate client sees it.
func drainOnce(b *testing.B, keys int, side drainSide) time.Duration {
	b.StopTimer()
	tb := setup(b)
	tb.topic = "bench"
	createTopic(b, tb, tb.topic, drainPartitions)
	fillBacklog(b, tb, drainRows, keys)
	ends := newEndOffsets(b, tb)
	defer ends.close()
	pool := delayproxy.Pool(b, tb.db.Pool) // through a delaying proxy in make bench-remote
	b.StartTimer()

	t0 := time.Now()
	stop := side(b, tb, pool)
	ends.waitFor(b, drainRows)
	elapsed := time.Since(t0)

	b.StopTimer()
	stop()
	b.StartTimer()
	return elapsed
}

func drainPgbox(b *testing.B, tb *testBundle, pool *pgxpool.Pool) func() {
	cfg := tb.configWithPool(pool, "bench")
	// Production settings: the test config's 100 ms heartbeat (which counts
	// the backlog each time) would tax the database ten times as often.
	cfg.Lanes, cfg.HeartbeatInterval, cfg.LeaseTTL, cfg.PollInterval, cfg.MaxBackoff = 0, 0, 0, 0, 0
	cfg.Logger = nil
	rr := start(b, cfg)
	return func() { rr.stop(b) }
}

func drainBaseline(b *testing.B, tb *testBundle, pool *pgxpool.Pool) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p, err := sarama.NewSyncProducer(tb.addrs, kafkaConfig())
		if err != nil {
			b.Error(err)
			return
		}
		defer p.Close()
		if err := baselineDrain(pool, p); err != nil {
			b.Error(err)
		}
	}()
	return func() { <-done }
}

// baselineDrain deletes and sends batches of 500 until the outbox is empty.
func baselineDrain(pool *pgxpool.Pool, p sarama.SyncProducer) error {
	ctx := context.Background()
	for {
		n := 0
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `DELETE FROM pgbox_outbox WHERE id IN (
				SELECT id FROM pgbox_outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
				RETURNING topic, key, value, event_id::text`, drainBatch)
			if err != nil {
				return err
			}
			msgs := make([]*sarama.ProducerMessage, 0, drainBatch)
			for rows.Next() {
				var topic, id string
				var key, value []byte
				if err := rows.Scan(&topic, &key, &value, &id); err != nil {
					return err
				}
				msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.ByteEncoder(key), Value: sarama.ByteEncoder(value),
					Headers: []sarama.RecordHeader{{Key: []byte(relay.EventIDHeader), Value: []byte(id)}}})
			}
			if err := rows.Err(); err != nil {
				return err
			}
			n = len(msgs)
			if n == 0 {
				return nil
			}
			return p.SendMessages(msgs)
		})
		if err != nil || n == 0 {
			return err
		}
	}
}

func createTopic(b *testing.B, tb *testBundle, topic string, partitions int32) {
	b.Helper()
	admin, err := sarama.NewClusterAdmin(tb.addrs, kafkaConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		b.Fatal(err)
	}
}

// fillBacklog commits n rows of drainValueBytes values over `keys` distinct
// keys (0: every row its own key) as outbox.Write would store them (event id,
// slot), with COPY so that the set-up stays short, then vacuums and analyzes.
func fillBacklog(b *testing.B, tb *testBundle, n, keys int) {
	b.Helper()
	ctx := context.Background()
	value := make([]byte, drainValueBytes)
	src := make([][]any, 0, n)
	for i := range n {
		k := i
		if keys > 0 {
			k = i % keys
		}
		key := fmt.Appendf(nil, "key-%d", k)
		id := outbox.NewEventID()
		src = append(src, []any{[16]byte(id), int16(slot.Of(key, id)), tb.topic, key, value})
	}
	if _, err := tb.db.Pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"event_id", "slot", "topic", "key", "value"},
		pgx.CopyFromRows(src)); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.db.Pool.Exec(ctx, `VACUUM ANALYZE pgbox_outbox`); err != nil {
		b.Fatal(err)
	}
}

// endOffsets reads a topic's end offsets through its own client: what a
// consumer could read, not what the producer believes it sent.
type endOffsets struct {
	client sarama.Client
	topic  string
	parts  []int32
}

func newEndOffsets(b *testing.B, tb *testBundle) *endOffsets {
	b.Helper()
	c, err := sarama.NewClient(tb.addrs, kafkaConfig())
	if err != nil {
		b.Fatal(err)
	}
	parts, err := c.Partitions(tb.topic)
	if err != nil {
		b.Fatal(err)
	}
	return &endOffsets{client: c, topic: tb.topic, parts: parts}
}

func (e *endOffsets) close() { _ = e.client.Close() }

func (e *endOffsets) sum(b *testing.B) int64 {
	var n int64
	for _, p := range e.parts {
		off, err := e.client.GetOffset(e.topic, p, sarama.OffsetNewest)
		if err != nil {
			b.Fatal(err)
		}
		n += off
	}
	return n
}

// waitFor polls the end offsets every 5 ms until they add up to want.
func (e *endOffsets) waitFor(b *testing.B, want int64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for e.sum(b) < want {
		if time.Now().After(deadline) {
			b.Fatalf("end offsets of %s still below %d after 5 minutes", e.topic, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// relaysEnv lists relay binaries for BenchmarkDrainBinaries, as
// "label=path,label=path" (scripts/bench-against.sh sets it).
const relaysEnv = "PGBOX_BENCH_RELAYS"

// BenchmarkDrainBinaries is BenchmarkDrain over relay binaries instead of
// the library in this process: the relay of an older commit beside
// today's, each a real process with default settings, and the baseline
// loop, in one sitting, the sides taking turns run by run. Each binary
// drains the same fresh backlog as BenchmarkDrain's (this tree's schema:
// migrations only add, so an older binary runs on it). It reports
// "<label>-msgs/s" per binary and the baseline's rate; the first label is
// reported as pgbox and compared with the baseline (x-baseline) and with
// every other label ("pgbox-vs-<label>-ratio", above 1: today's is faster).
// Without PGBOX_BENCH_RELAYS it is skipped. Not through the delaying proxy
// of make bench-remote.
//
//	scripts/bench-against.sh f0acb98
func BenchmarkDrainBinaries(b *testing.B) {
	bins := benchRelays(b)
	for _, keys := range []int{1000, 0, 10} {
		name := "keys=" + strconv.Itoa(keys)
		if keys == 0 {
			name = "keys=unique"
		}
		b.Run(name, func(b *testing.B) {
			took := make([]time.Duration, len(bins)+1) // the baseline last
			sides := make([]drainSide, len(bins)+1)
			for i, bn := range bins {
				sides[i] = drainBinary(bn.path)
			}
			sides[len(bins)] = drainBaseline
			for i := range b.N {
				for j := range sides {
					k := (j + i) % len(sides) // each run starts with another side
					took[k] += drainOnce(b, keys, sides[k])
				}
			}
			n := float64(b.N * drainRows)
			for i, bn := range bins {
				b.ReportMetric(n/took[i].Seconds(), bn.label+"-msgs/s")
			}
			base := took[len(bins)]
			b.ReportMetric(n/base.Seconds(), "baseline-msgs/s")
			b.ReportMetric(base.Seconds()/took[0].Seconds(), "x-baseline")
			for i, bn := range bins[1:] {
				b.ReportMetric(took[i+1].Seconds()/took[0].Seconds(), "pgbox-vs-"+bn.label+"-ratio")
			}
		})
	}
}

// benchBin is a relay binary of PGBOX_BENCH_RELAYS.
type benchBin struct{ label, path string }

// benchRelays are the binaries PGBOX_BENCH_RELAYS names, the first
// labelled pgbox (this tree's); without it the benchmark is skipped.
func benchRelays(b *testing.B) []benchBin {
	spec := os.Getenv(relaysEnv)
	if spec == "" {
		b.Skip(relaysEnv + " is not set: run scripts/bench-against.sh <commit>")
	}
	var bins []benchBin
	for _, kv := range strings.Split(spec, ",") {
		label, path, ok := strings.Cut(kv, "=")
		if !ok || label == "" || path == "" {
			b.Fatalf("%s=%q: want label=path,label=path", relaysEnv, spec)
		}
		bins = append(bins, benchBin{label, path})
	}
	bins[0].label = "pgbox"
	return bins
}

// BenchmarkLatencyBinaries is BenchmarkLatency's "notify" run over relay
// binaries: the relay of an older commit beside today's, each a real
// process with default settings on a fresh schema, taking turns run by
// run, 8 writers committing 1,000 single-message transactions a second
// for 5 s with outbox Notify, commit to a consumer's receipt. It reports
// "<label>-p50-ms" and "<label>-p99-ms" per binary, the first label as
// pgbox, and "pgbox-vs-<label>-p99-ratio" (below 1: today's is faster).
// Without PGBOX_BENCH_RELAYS it is skipped.
//
//	scripts/bench-against.sh f0acb98
func BenchmarkLatencyBinaries(b *testing.B) {
	bins := benchRelays(b)
	all := make([][]time.Duration, len(bins))
	for i := range b.N {
		for j := range bins {
			k := (j + i) % len(bins) // each run starts with another binary
			run, _ := latencyRun(b, drainBinary(bins[k].path), true, 8, 1000, 5*time.Second)
			all[k] = append(all[k], run...)
		}
	}
	for i, bn := range bins {
		slices.Sort(all[i])
		b.ReportMetric(quantileMs(all[i], 0.50), bn.label+"-p50-ms")
		b.ReportMetric(quantileMs(all[i], 0.99), bn.label+"-p99-ms")
	}
	for i, bn := range bins[1:] {
		b.ReportMetric(quantileMs(all[0], 0.99)/quantileMs(all[i+1], 0.99), "pgbox-vs-"+bn.label+"-p99-ratio")
	}
}

// drainBinary runs the relay binary at path on tb's schema with default
// settings (no cleanup schedule, no HTTP server; tb's LISTEN channel)
// until stopped.
func drainBinary(path string) drainSide {
	return func(b *testing.B, tb *testBundle, _ *pgxpool.Pool) func() {
		cmd := exec.Command(path, "run", "--database-url", tb.db.URL, "--kafka-brokers", strings.Join(tb.addrs, ","),
			"--cleanup-interval", "0s", "--http-addr", "", "--channel", tb.channel)
		cmd.Env = testutil.CleanEnv()
		var out testutil.SyncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			b.Fatalf("start %s: %v", path, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-done:
				if err != nil {
					b.Errorf("%s exited with %v:\n%s", path, err, out.String())
				}
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				b.Errorf("%s did not stop within 30s of SIGTERM:\n%s", path, out.String())
			}
		}
	}
}
