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

// The watched key: an ordinary key (the bulk inserts spread rows over it
// too) that the writers also pick for one transaction in
// pressureHotEvery, and the long writer writes on. The meter keeps its
// rows' begin and commit times and the order they arrived in, to check key
// order at the end.
const pressureHotEvery = 50

var pressureHotKey = pressureKey(0)

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
	seq    *atomic.Int64
	errs   atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// writeFunc writes one transaction's event, sequence number seq, and
// returns its key.
type writeFunc func(ctx context.Context, tx pgx.Tx, seq int64) (key string, err error)

func startWriters(ctx context.Context, t *testing.T, url string, sc pressureScale, m *meter) *writers {
	return startWritersFunc(ctx, t, url, sc.Rate, new(atomic.Int64), m, func(ctx context.Context, tx pgx.Tx, seq int64) (string, error) {
		key := pressureKey(rand.IntN(sc.Keys))
		if rand.IntN(pressureHotEvery) == 0 {
			key = pressureHotKey
		}
		return key, outbox.Write(ctx, tx, outbox.Message{Topic: pressureTopic, Key: []byte(key), Value: pressureValue(seq)})
	})
}

// startWritersFunc commits rate transactions per second, each written by
// write, numbering the events from seq (shared by writer sets that feed
// one meter).
func startWritersFunc(ctx context.Context, t *testing.T, url string, rate int, seq *atomic.Int64, m *meter, write writeFunc) *writers {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withParam(t, url, "application_name", "writer"))
	require.NoError(t, err)
	cfg.MaxConns = pressureWriters
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{pool: pool, seq: seq, cancel: cancel}
	tokens := make(chan struct{}, rate) // a second's worth of schedule at most
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
			for due := int64(time.Since(start).Seconds()*float64(rate)) - issued; due > 0; due-- {
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
			// A transaction runs to its end once begun: cancelled at its
			// COMMIT, it might commit unrecorded and arrive unwritten.
			txCtx := context.WithoutCancel(ctx)
			for range tokens {
				if ctx.Err() != nil {
					continue // stopping: drop the schedule's leftovers
				}
				seq := w.seq.Add(1)
				began := time.Now()
				var key string
				err := pgx.BeginFunc(txCtx, pool, func(tx pgx.Tx) error {
					var err error
					key, err = write(txCtx, tx, seq)
					return err
				})
				if err != nil {
					w.errs.Add(1)
					continue
				}
				at := time.Now()
				m.committed(seq, at)
				if key == pressureHotKey {
					m.keyCommitted(seq, began, at)
				}
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
	// sent: commit → the record's timestamp (the relay sets it when it
	// builds the record batch; millisecond precision), the relay's share
	// of latency.
	sent time.Duration
}

// arrival is when the consumer saw a record, and the record's timestamp.
type arrival struct{ at, sent time.Time }

// meter pairs commits with arrivals. Either may come first: a bulk insert's
// rows can reach the consumer before their commit is recorded.
type meter struct {
	mu         sync.Mutex
	pending    map[int64]time.Time // committed, not seen yet
	early      map[int64]arrival   // seen, commit not recorded yet
	seen       []uint64            // bitset of sequence numbers seen
	committedN int64
	published  int64
	duplicates int64
	window     []time.Duration // latencies seen since the last take
	all        []sample
	bursts     []*burstRange
	keyRows    map[int64]keyRow    // the watched key's committed rows
	keyArrived []int64             // the watched key's rows, in the order they arrived (one partition: offset order)
	keyAt      map[int64]time.Time // when each of them arrived

	client   sarama.Client
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
}

func newMeter() *meter {
	return &meter{pending: map[int64]time.Time{}, early: map[int64]arrival{}, keyRows: map[int64]keyRow{}, keyAt: map[int64]time.Time{}}
}

// keyRow is when a row of the watched key was written: its transaction
// began (before the row took its id) and its COMMIT returned.
type keyRow struct{ began, committed time.Time }

// keyCommitted records a committed row of the watched key (besides
// committed, which counts it).
func (m *meter) keyCommitted(seq int64, began, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keyRows[seq] = keyRow{began: began, committed: at}
}

// consume reads every partition of the topic from the start, in its own
// client: arrival is when a consumer receives the record.
func (m *meter) consume(ctx context.Context, t *testing.T, addr string) {
	t.Helper()
	m.consumeTopics(ctx, t, addr, []string{pressureTopic}, nil)
}

// consumeTopics reads every partition of topics from the start; check, when
// set, sees every record first.
func (m *meter) consumeTopics(ctx context.Context, t *testing.T, addr string, topics []string, check func(*sarama.ConsumerMessage)) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.ClientID = "pressure-consumer"
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	var err error
	m.client, err = sarama.NewClient([]string{addr}, cfg)
	require.NoError(t, err)
	m.consumer, err = sarama.NewConsumerFromClient(m.client)
	require.NoError(t, err)
	for _, topic := range topics {
		parts, err := m.client.Partitions(topic)
		require.NoError(t, err)
		for _, part := range parts {
			pc, err := m.consumer.ConsumePartition(topic, part, sarama.OffsetOldest)
			require.NoError(t, err)
			m.pcs = append(m.pcs, pc)
			m.wg.Go(func() {
				for msg := range pc.Messages() {
					at := time.Now()
					if check != nil {
						check(msg)
					}
					if seq, ok := parseSeq(msg.Value); ok {
						m.arrived(seq, string(msg.Key) == pressureHotKey, arrival{at: at, sent: msg.Timestamp})
					}
				}
			})
		}
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

func (m *meter) arrived(seq int64, watched bool, a arrival) {
	at := a.at
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
	if watched {
		m.keyArrived = append(m.keyArrived, seq)
		m.keyAt[seq] = at
	}
	for _, b := range m.bursts {
		if seq >= b.first && seq < b.first+b.n {
			b.seen++
			b.last = at
		}
	}
	if c, ok := m.pending[seq]; ok {
		delete(m.pending, seq)
		m.record(c, a)
		return
	}
	m.early[seq] = a
}

func (m *meter) record(commit time.Time, a arrival) {
	lat := max(0, a.at.Sub(commit))
	m.window = append(m.window, lat)
	var sent time.Duration
	if !a.sent.IsZero() {
		sent = max(0, a.sent.Sub(commit))
	}
	m.all = append(m.all, sample{commit: commit, latency: lat, sent: sent})
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

// keyOrder checks the watched key's order: a row whose COMMIT returned
// before another row's transaction began took the lower id and was
// visible first, so it must arrive first (rows of overlapping
// transactions may arrive in either order). It returns up to five
// inversions found, and how many arrived rows it checked.
func (m *meter) keyOrder() (inversions []string, checked int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	type arrival struct {
		seq int64
		keyRow
	}
	var arr []arrival
	for _, seq := range m.keyArrived {
		if r, ok := m.keyRows[seq]; ok {
			arr = append(arr, arrival{seq, r})
		}
	}
	// earliest[i]: the row arriving at i or later whose COMMIT returned
	// first; a row that began after it returned and arrived before it is
	// an inversion.
	earliest := make([]int, len(arr)+1)
	earliest[len(arr)] = -1
	for i := len(arr) - 1; i >= 0; i-- {
		earliest[i] = i
		if j := earliest[i+1]; j >= 0 && arr[j].committed.Before(arr[i].committed) {
			earliest[i] = j
		}
	}
	for i, a := range arr {
		if j := earliest[i+1]; j >= 0 && arr[j].committed.Before(a.began) && len(inversions) < 5 {
			inversions = append(inversions, fmt.Sprintf("seq %d (began %s after seq %d committed) arrived %d records before it",
				a.seq, a.began.Sub(arr[j].committed).Round(time.Microsecond), arr[j].seq, j-i))
		}
	}
	return inversions, len(arr)
}

// keyPosition says where seq, a row of the watched key, arrived among the
// key's rows (how many arrived before it) and when; ok is false when it
// never arrived.
func (m *meter) keyPosition(seq int64) (before int, at time.Time, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.Index(m.keyArrived, seq)
	return i, m.keyAt[seq], i >= 0
}

// keyRowsBetween counts the watched key's rows whose transaction began
// after from and whose COMMIT returned before to, and how many of those
// arrived before seq.
func (m *meter) keyRowsBetween(from, to time.Time, seq int64) (n, arrivedBefore int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at := make(map[int64]int, len(m.keyArrived))
	for i, s := range m.keyArrived {
		at[s] = i
	}
	pos, ok := at[seq]
	for s, r := range m.keyRows {
		if s == seq || !r.began.After(from) || !r.committed.Before(to) {
			continue
		}
		n++
		if i, in := at[s]; in && (!ok || i < pos) {
			arrivedBefore++
		}
	}
	return n, arrivedBefore
}

func (m *meter) totals() (committed, published int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.committedN, m.published
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

// burstProgress says how many of b's events arrived so far and when the
// last of them did.
func (m *meter) burstProgress(b *burstRange) (seen int64, last time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return b.seen, b.last
}

// missingIn counts the committed events numbered from..to that have not
// arrived yet.
func (m *meter) missingIn(from, to int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for seq := range m.pending {
		if seq >= from && seq <= to {
			n++
		}
	}
	return n
}
