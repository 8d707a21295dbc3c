package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
)

// The scenario's events: a 200-byte value that starts with the event's
// sequence number ("seq=000000000042 xxx…"), so the consumer can pair each
// record with its commit time.
const (
	pressureValueBytes = 200
	pressureSeqPrefix  = "seq="
	pressureSeqDigits  = 12
	pressureWriters    = 32 // concurrent writer transactions at most
	pressurePartitions = 6
)

func pressureKey(i int) string { return "acct-" + strconv.Itoa(i) }

// pressureSlot is the slot of a keyed row (the event id plays no part).
func pressureSlot(key string) int { return slot.Of([]byte(key), [16]byte{}) }

func pressureValue(seq int64) []byte {
	v := make([]byte, 0, pressureValueBytes)
	v = fmt.Appendf(v, "%s%0*d ", pressureSeqPrefix, pressureSeqDigits, seq)
	for len(v) < pressureValueBytes {
		v = append(v, 'x')
	}
	return v
}

func parseSeq(v []byte) (int64, bool) {
	n := len(pressureSeqPrefix)
	if len(v) < n+pressureSeqDigits || string(v[:n]) != pressureSeqPrefix {
		return 0, false
	}
	seq, err := strconv.ParseInt(string(v[n:n+pressureSeqDigits]), 10, 64)
	return seq, err == nil
}

func pressureTopicDetail() *sarama.TopicDetail {
	forever := "-1"
	return &sarama.TopicDetail{NumPartitions: pressurePartitions, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &forever}}
}

func newAdmin(addr string) (sarama.ClusterAdmin, error) {
	return sarama.NewClusterAdmin([]string{addr}, kafkatest.Config())
}

func dialOnce(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// writers commit one event per transaction at sc.Rate per second, each on a
// random key, through up to pressureWriters connections. A writer that
// cannot keep up falls behind the schedule (the table shows the rate
// reached), it never drops a transaction.
type writers struct {
	pool   *pgxpool.Pool
	seq    atomic.Int64
	errs   atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

func startWriters(ctx context.Context, t *testing.T, url string, sc pressureScale, m *meter) *writers {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withParam(t, url, "application_name", "writer"))
	require.NoError(t, err)
	cfg.MaxConns = pressureWriters
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{pool: pool, cancel: cancel}
	tokens := make(chan struct{}, sc.Rate) // a second's worth of schedule at most
	w.wg.Go(func() {
		defer close(tokens)
		start, issued := time.Now(), int64(0)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for due := int64(time.Since(start).Seconds()*float64(sc.Rate)) - issued; due > 0; due-- {
				select {
				case tokens <- struct{}{}:
					issued++
				case <-ctx.Done():
					return
				}
			}
		}
	})
	for range pressureWriters {
		w.wg.Go(func() {
			for range tokens {
				seq := w.seq.Add(1)
				key := []byte(pressureKey(rand.IntN(sc.Keys)))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return outbox.Write(ctx, tx, outbox.Message{Topic: pressureTopic, Key: key, Value: pressureValue(seq)})
				})
				if err != nil {
					if ctx.Err() == nil {
						w.errs.Add(1)
					}
					continue
				}
				m.committed(seq, time.Now())
			}
		})
	}
	return w
}

// reserve takes n sequence numbers for a bulk insert and returns the first.
func (w *writers) reserve(n int64) int64 { return w.seq.Add(n) - n + 1 }

func (w *writers) stop() {
	w.once.Do(func() {
		w.cancel()
		w.wg.Wait()
		w.pool.Close()
	})
}

// sample is one event's commit time and commit→Kafka latency.
type sample struct {
	commit  time.Time
	latency time.Duration
}

// meter pairs commits with arrivals. Either may come first: a bulk insert's
// rows can reach the consumer before their commit is recorded.
type meter struct {
	mu         sync.Mutex
	pending    map[int64]time.Time // committed, not seen yet
	early      map[int64]time.Time // seen, commit not recorded yet
	seen       []uint64            // bitset of sequence numbers seen
	committedN int64
	published  int64
	duplicates int64
	window     []time.Duration // latencies seen since the last take
	all        []sample
	bursts     []*burstRange

	client   sarama.Client
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
}

func newMeter() *meter {
	return &meter{pending: map[int64]time.Time{}, early: map[int64]time.Time{}}
}

// consume reads every partition of the topic from the start, in its own
// client: arrival is when a consumer receives the record.
func (m *meter) consume(ctx context.Context, t *testing.T, addr string) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.ClientID = "pressure-consumer"
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	var err error
	m.client, err = sarama.NewClient([]string{addr}, cfg)
	require.NoError(t, err)
	m.consumer, err = sarama.NewConsumerFromClient(m.client)
	require.NoError(t, err)
	parts, err := m.client.Partitions(pressureTopic)
	require.NoError(t, err)
	for _, part := range parts {
		pc, err := m.consumer.ConsumePartition(pressureTopic, part, sarama.OffsetOldest)
		require.NoError(t, err)
		m.pcs = append(m.pcs, pc)
		m.wg.Go(func() {
			for msg := range pc.Messages() {
				at := time.Now()
				if seq, ok := parseSeq(msg.Value); ok {
					m.arrived(seq, at)
				}
			}
		})
	}
}

func (m *meter) close() {
	for _, pc := range m.pcs {
		pc.AsyncClose()
	}
	m.wg.Wait()
	if m.consumer != nil {
		_ = m.consumer.Close()
	}
	if m.client != nil {
		_ = m.client.Close()
	}
}

func (m *meter) committed(seq int64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.commitLocked(seq, at)
}

func (m *meter) committedRange(b *burstRange, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b.commit = at
	first, n := b.first, b.n
	for seq := first; seq < first+n; seq++ {
		m.commitLocked(seq, at)
	}
}

func (m *meter) commitLocked(seq int64, at time.Time) {
	m.committedN++
	if a, ok := m.early[seq]; ok {
		delete(m.early, seq)
		m.record(at, a)
		return
	}
	m.pending[seq] = at
}

func (m *meter) arrived(seq int64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, bit := seq/64, uint64(1)<<(seq%64)
	if int(i) >= len(m.seen) {
		m.seen = append(m.seen, make([]uint64, int(i)+1-len(m.seen)+1<<14)...)
	}
	if m.seen[i]&bit != 0 {
		m.duplicates++
		return
	}
	m.seen[i] |= bit
	m.published++
	for _, b := range m.bursts {
		if seq >= b.first && seq < b.first+b.n {
			b.seen++
			b.last = at
		}
	}
	if c, ok := m.pending[seq]; ok {
		delete(m.pending, seq)
		m.record(c, at)
		return
	}
	m.early[seq] = at
}

func (m *meter) record(commit, arrival time.Time) {
	lat := max(0, arrival.Sub(commit))
	m.window = append(m.window, lat)
	m.all = append(m.all, sample{commit: commit, latency: lat})
}

// take returns the totals so far and the latencies seen since the last take.
func (m *meter) take() (committed, published int64, backlog int, lat []time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	lat, m.window = m.window, nil
	return m.committedN, m.published, len(m.pending), lat
}

func (m *meter) missing() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// waitAll waits until every committed event has been seen.
func (m *meter) waitAll(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for m.missing() > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// burstRange is a bulk insert's sequence numbers, committed at once: it is
// drained when the last of them arrives.
type burstRange struct {
	phase    string
	first, n int64
	seen     int64 // the range's events seen so far (any seen before the range was registered are not counted: none can be, it is registered before the INSERT)
	last     time.Time
	commit   time.Time
}

// watchBurst registers a range before its rows are inserted.
func (m *meter) watchBurst(phase string, first, n int64) *burstRange {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := &burstRange{phase: phase, first: first, n: n}
	m.bursts = append(m.bursts, b)
	return b
}

// burstResults says how long each burst took to arrive whole.
func (m *meter) burstResults() []burstResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []burstResult
	for _, b := range m.bursts {
		r := burstResult{Phase: b.phase, Rows: int(b.n), Drained: -1}
		if b.seen == b.n {
			r.Drained = b.last.Sub(b.commit)
		}
		out = append(out, r)
	}
	return out
}

// samples returns every paired event so far.
func (m *meter) samples() []sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.all)
}

func (m *meter) duplicateCount() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.duplicates
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
