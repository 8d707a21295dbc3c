package relay

// Hostile review of b90eca6 (producer.go: a request to a broker carries
// every waiting batch of the producers sharing a kafkaClient, sendQueue).
// These attacks drive the real send path (Relay.sendBatch over producers
// sharing one kafkaClient, as a Fleet's targets do) against the embedded
// broker (kfake), whose Produce requests a control function delays, fails
// or inspects. No database is needed at this level: sendBatch only reads
// rows, and its outcome is what the pass would record.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/outbox"
)

// ssHarness is one broker, one kafkaClient shared by the producers made
// with producer, and a log of every Produce request the broker saw.
type ssHarness struct {
	t     *testing.T
	c     *kfake.Cluster
	addrs []string
	conf  *sarama.Config
	kc    *kafkaClient

	mu   sync.Mutex
	reqs []ssReq
}

// ssReq is one Produce request as the broker saw it.
type ssReq struct {
	pids  map[int64]bool
	parts map[string]int // "topic/partition" -> record batches in it
	bytes int
}

func newSSHarness(t *testing.T, topics map[string]int32, topicConfigs map[string]map[string]*string) *ssHarness {
	t.Helper()
	c := kafkatest.New(t)
	h := &ssHarness{t: t, c: c, addrs: c.ListenAddrs()}
	for topic, n := range topics {
		kafkatest.CreateTopic(t, h.addrs, topic, n, topicConfigs[topic])
	}
	conf := kafkatest.Config()
	conf.Producer.RequiredAcks = sarama.WaitForAll
	conf.Producer.Idempotent = true
	conf.Net.MaxOpenRequests = 1
	conf.Producer.Retry.Max = 5
	conf.Producer.Partitioner = NewMurmur2Partitioner
	conf.Producer.MaxMessageBytes = 2000 // several batches per partition per send
	h.conf = conf
	h.kc = &kafkaClient{brokers: h.addrs, conf: conf}
	t.Cleanup(h.kc.close)
	// The observer: runs first on every Produce request and lets the next
	// control function (or the broker) handle it.
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		h.record(req.(*kmsg.ProduceRequest))
		return nil, nil, false
	})
	return h
}

func (h *ssHarness) record(req *kmsg.ProduceRequest) {
	r := ssReq{pids: map[int64]bool{}, parts: map[string]int{}}
	for _, tp := range req.Topics {
		for _, p := range tp.Partitions {
			n, pids := ssBatches(p.Records)
			r.parts[fmt.Sprintf("%s/%d", tp.Topic, p.Partition)] += n
			for _, pid := range pids {
				r.pids[pid] = true
			}
			r.bytes += len(p.Records)
		}
	}
	h.mu.Lock()
	h.reqs = append(h.reqs, r)
	h.mu.Unlock()
}

func (h *ssHarness) requests() []ssReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]ssReq(nil), h.reqs...)
}

// checkRequests: no request carried two batches of one partition.
func (h *ssHarness) checkRequests() (mixed int) {
	for i, r := range h.requests() {
		for tp, n := range r.parts {
			require.LessOrEqual(h.t, n, 1, "request %d carried %d batches of %s", i, n, tp)
		}
		if len(r.pids) > 1 {
			mixed++
		}
	}
	return mixed
}

func ssBatches(records []byte) (n int, pids []int64) {
	for len(records) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(records); err != nil {
			return n, pids
		}
		n++
		pids = append(pids, b.ProducerID)
		size := 12 + int(b.Length)
		if size > len(records) {
			break
		}
		records = records[size:]
	}
	return n, pids
}

func (h *ssHarness) producer() *producer {
	h.t.Helper()
	p, err := newProducer(context.Background(), h.addrs, h.conf, h.kc)
	require.NoError(h.t, err)
	return p
}

// warm takes p's producer id and the topics' metadata now: kfake answers
// requests one at a time, so none is answered while a gate holds one.
func warm(t *testing.T, p *producer, topics ...string) {
	t.Helper()
	require.NoError(t, p.renew(context.Background()))
	for _, topic := range topics {
		_, err := p.partitions(context.Background(), topic)
		require.NoError(t, err)
	}
}

// ssRelay is the part of a Relay sendBatch uses: its lease always held.
func ssRelay(stop time.Duration) *Relay {
	r := &Relay{cfg: Config{StopTimeout: stop}, log: slog.New(slog.DiscardHandler), t0: time.Now()}
	r.leaseUntil.Store(int64(time.Hour))
	return r
}

// ssRows makes rounds*keys rows of topic: key "<name>-k<j>", value the
// round, in round order (a key's rows in id order), values padded to pad
// bytes.
func ssRows(topic, name string, keys, from, rounds, pad int) []row {
	var rows []row
	for round := from; round < from+rounds; round++ {
		for k := range keys {
			v := []byte(strconv.Itoa(round))
			for len(v) < pad {
				v = append(v, ' ')
			}
			rows = append(rows, row{id: int64(len(rows) + 1), eventID: outbox.NewEventID(), topic: topic,
				key: []byte(fmt.Sprintf("%s-k%d", name, k)), value: v, createdAt: time.Now()})
		}
	}
	return rows
}

// ssSendAll sends rows in passes of pass rows with sendBatch until every
// row is acknowledged, as a relay would (failed rows come back in the next
// pass, in id order, with the rows after them); it fails the test if a
// pass stops, and returns how many passes had failed rows.
func ssSendAll(t *testing.T, r *Relay, p *producer, rows []row, pass int) (failedPasses int) {
	ctx := context.Background()
	for len(rows) > 0 {
		n := min(pass, len(rows))
		outcome, stopped := r.sendBatch(ctx, p, rows[:n], 0)
		require.False(t, stopped)
		// Rows acknowledged leave; the first failed or held row and
		// everything after it stay (conservative: order is by key, but a
		// prefix is simplest and still in id order per key).
		done := 0
		for done < n {
			if err, ok := outcome[done]; !ok || err != nil {
				break
			}
			done++
		}
		if done < n {
			failedPasses++
			// A row of a key after a failed row of that key must not have
			// been acknowledged (the relay's per-key hold).
			failed := map[string]bool{}
			for i := range n {
				err, tried := outcome[i]
				k := string(rows[i].key)
				if !tried || err != nil {
					failed[k] = true
					continue
				}
				require.False(t, failed[k], "row %d of key %s acknowledged after an earlier row of its key failed", i, k)
			}
			// Keep acknowledged rows out of the next pass.
			var left []row
			for i := range n {
				if err, ok := outcome[i]; !ok || err != nil {
					left = append(left, rows[i])
				}
			}
			rows = append(left, rows[n:]...)
			if failedPasses > 50 {
				t.Fatalf("rows keep failing: %v", firstErr(outcome))
			}
			continue
		}
		rows = rows[n:]
	}
	return failedPasses
}

func firstErr(outcome map[int]error) error {
	for _, err := range outcome {
		if err != nil {
			return err
		}
	}
	return nil
}

// ssCheckTopic reads topic and checks that each key's values are 0, 1, 2,
// ... exactly once each, want records in all.
func ssCheckTopic(t *testing.T, addrs []string, topic string, want int) {
	t.Helper()
	got := kafkatest.ReadAll(t, addrs, topic, want, 30*time.Second)
	next := map[string]int{}
	for _, m := range got {
		key := string(m.Key)
		v, err := strconv.Atoi(trimSpace(string(m.Value)))
		require.NoError(t, err)
		require.Equal(t, next[key], v, "topic %s key %s: lost, duplicated or out of order", topic, key)
		next[key]++
	}
	require.Len(t, got, want, "topic %s: every record once", topic)
}

func trimSpace(s string) string {
	for len(s) > 0 && s[len(s)-1] == ' ' {
		s = s[:len(s)-1]
	}
	return s
}

// ssGate holds Produce requests matching match (after the observer saw
// them) until open is called; closed by the test's cleanup before the
// broker closes.
type ssGate struct {
	ch   chan struct{}
	once sync.Once
	held atomic.Int32
}

func (g *ssGate) open() { g.once.Do(func() { close(g.ch) }) }

func (h *ssHarness) gate(match func(*kmsg.ProduceRequest) bool) *ssGate {
	g := &ssGate{ch: make(chan struct{})}
	h.t.Cleanup(g.open) // runs before the cluster's Close (registered later)
	h.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if match(req.(*kmsg.ProduceRequest)) {
			g.held.Add(1)
			<-g.ch
		}
		return nil, nil, false
	})
	return g
}

func reqPids(req *kmsg.ProduceRequest) map[int64]bool {
	pids := map[int64]bool{}
	for _, tp := range req.Topics {
		for _, p := range tp.Partitions {
			_, ps := ssBatches(p.Records)
			for _, pid := range ps {
				pids[pid] = true
			}
		}
	}
	return pids
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// queued counts the batches waiting in the client's send queues.
func (k *kafkaClient) queued() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, q := range k.queues {
		n += len(q.waiting)
	}
	return n
}

// Attack: a combined request (several producers' batches) fails as a
// whole. The first such request is answered too late (after the client's
// read timeout; the broker writes it all the same: written, unacknowledged),
// the second such request has its connection closed unanswered (nothing
// written). Every producer must retry its own batches with their sequences:
// each key's records arrive once each, in order, and no row fails for good.
func TestSharedSendAttackConnectionLostMidCombined(t *testing.T) {
	topics := map[string]int32{"shared": 1, "own0": 2, "own1": 2, "own2": 1}
	h := newSSHarness(t, topics, nil)
	h.conf.Net.ReadTimeout = 400 * time.Millisecond
	var combined atomic.Int32
	h.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if len(reqPids(req.(*kmsg.ProduceRequest))) < 2 {
			return nil, nil, false
		}
		switch combined.Add(1) {
		case 1:
			time.Sleep(time.Second) // past the read timeout: written, unanswered
			return nil, nil, false
		case 3:
			return nil, errors.New("connection lost"), true // closed: not written
		}
		return nil, nil, false
	})
	const keys, rounds = 4, 60
	type job struct {
		p    *producer
		rows []row
	}
	var jobs []job
	for i, topic := range []string{"shared", "shared", "own0", "own1", "own2"} {
		jobs = append(jobs, job{h.producer(), ssRows(topic, "p"+strconv.Itoa(i), keys, 0, rounds, 100)})
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), j.p, j.rows, 80) })
	}
	wg.Wait()
	ssCheckTopic(t, h.addrs, "shared", 2*keys*rounds)
	for _, topic := range []string{"own0", "own1", "own2"} {
		ssCheckTopic(t, h.addrs, topic, keys*rounds)
	}
	require.GreaterOrEqual(t, combined.Load(), int32(3), "the attack needs three combined requests")
	h.checkRequests()
}

// Attack: one producer's batch is rejected (MESSAGE_TOO_LARGE for its
// partition: the topic's max.message.bytes is small) in the same request
// as another producer's batches, which succeed. Only the bad row fails
// (its batch is split to find it); every other row of both producers is
// acknowledged, and the good producer sees no error at all.
func TestSharedSendAttackOnePartitionRejected(t *testing.T) {
	small := "600"
	h := newSSHarness(t, map[string]int32{"strict": 1, "lax": 2},
		map[string]map[string]*string{"strict": {"max.message.bytes": &small}})
	// Hold the first request so both producers' first batches gather
	// behind it and share the second.
	var first atomic.Bool
	h.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if first.CompareAndSwap(false, true) {
			time.Sleep(300 * time.Millisecond)
		}
		return nil, nil, false
	})
	bad := ssRows("strict", "bad", 1, 0, 1, 0)
	bad = append(bad, ssRows("strict", "ok", 1, 0, 1, 0)...)
	bad[0].value = make([]byte, 1200) // too large for "strict", not for the producer
	pBad, pGood := h.producer(), h.producer()
	good := ssRows("lax", "good", 4, 0, 3, 0)
	decoy := h.producer()
	var (
		wg                sync.WaitGroup
		outBad, outGood   map[int]error
		stopBad, stopGood bool
		decoyRows         = ssRows("lax", "decoy", 1, 0, 1, 0)
	)
	wg.Go(func() { ssRelay(5*time.Second).sendBatch(context.Background(), decoy, decoyRows, 0) })
	time.Sleep(50 * time.Millisecond) // the decoy's request is the held one
	wg.Go(func() { outBad, stopBad = ssRelay(5*time.Second).sendBatch(context.Background(), pBad, bad, 0) })
	wg.Go(func() { outGood, stopGood = ssRelay(5*time.Second).sendBatch(context.Background(), pGood, good, 0) })
	wg.Wait()
	require.False(t, stopBad)
	require.False(t, stopGood)
	require.Len(t, outGood, len(good))
	for i, err := range outGood {
		require.NoError(t, err, "good row %d", i)
	}
	require.ErrorIs(t, outBad[0], sarama.ErrMessageSizeTooLarge)
	require.NoError(t, outBad[1], "the bad row's neighbour of another key")
	got := kafkatest.ReadAll(t, h.addrs, "lax", len(good)+1, 30*time.Second)
	require.Len(t, got, len(good)+1)
	got = kafkatest.ReadAll(t, h.addrs, "strict", 1, 30*time.Second)
	require.Len(t, got, 1)
	require.Equal(t, "ok-k0", string(got[0].Key))
	h.checkRequests()
	// Did the bad and the good batch share a request? (The attack's
	// premise; report rather than fail if the scheduler kept them apart.)
	shared := false
	for _, r := range h.requests() {
		if r.parts["strict/0"] > 0 && (r.parts["lax/0"] > 0 || r.parts["lax/1"] > 0) && len(r.pids) > 1 {
			shared = true
		}
	}
	t.Logf("bad and good batches shared a request: %v", shared)
}

// Attack: several producers on the same partitions under sustained load,
// many passes each, concurrently. Each key's records arrive once each and
// in order; no request ever carries two batches of one partition; requests
// are shared.
func TestSharedSendAttackSamePartitionSustained(t *testing.T) {
	h := newSSHarness(t, map[string]int32{"hot": 2}, nil)
	var n atomic.Int32
	h.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if n.Add(1)%7 == 0 {
			time.Sleep(10 * time.Millisecond) // let batches gather now and then
		}
		return nil, nil, false
	})
	const producers, keys, rounds = 6, 5, 80
	var wg sync.WaitGroup
	for i := range producers {
		p := h.producer()
		rows := ssRows("hot", "p"+strconv.Itoa(i), keys, 0, rounds, 50)
		wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), p, rows, 37) })
	}
	wg.Wait()
	ssCheckTopic(t, h.addrs, "hot", producers*keys*rounds)
	mixed := h.checkRequests()
	require.Positive(t, mixed, "no request carried several producers' batches")
}

// Attack: a relay stops (its context canceled) while its batches wait in
// the queue behind a request the broker holds. sendBatch must give up
// within StopTimeout (it returns while the broker still holds the request);
// the other producer's send completes once the broker answers; the queue
// drains (nothing blocked on the stopped relay's channel).
func TestSharedSendAttackStopWhileQueued(t *testing.T) {
	h := newSSHarness(t, map[string]int32{"a": 1, "b": 1}, nil)
	g := h.gate(func(req *kmsg.ProduceRequest) bool { return true })
	pA, pB := h.producer(), h.producer()
	warm(t, pA, "a", "b")
	warm(t, pB, "a", "b")
	rowsA := ssRows("a", "a", 2, 0, 5, 0)
	rowsB := ssRows("b", "b", 2, 0, 5, 0)
	var wg sync.WaitGroup
	var outA map[int]error
	wg.Go(func() { outA, _ = ssRelay(5*time.Second).sendBatch(context.Background(), pA, rowsA, 0) })
	waitUntil(t, "the broker holds A's request", func() bool { return g.held.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	type res struct {
		out     map[int]error
		stopped bool
	}
	bDone := make(chan res, 1)
	go func() {
		out, stopped := ssRelay(200*time.Millisecond).sendBatch(ctx, pB, rowsB, 0)
		bDone <- res{out, stopped}
	}()
	waitUntil(t, "B's batch waits in the queue", func() bool { return h.kc.queued() == 1 })
	cancel()
	var b res
	select {
	case b = <-bDone:
	case <-time.After(20 * time.Second):
		t.Fatal("B did not stop while its batch waited behind the held request")
	}
	require.True(t, b.stopped)
	require.Equal(t, int32(1), g.held.Load(), "B returned while the broker still held A's request")
	for i := range rowsB {
		_, answered := b.out[i]
		require.False(t, answered, "row %d of the stopped relay has an outcome", i)
	}
	require.True(t, pB.stale, "a batch may still land under B's producer id")
	g.open()
	wg.Wait()
	for i := range rowsA {
		require.NoError(t, outA[i])
	}
	waitUntil(t, "the queues drain", func() bool {
		h.kc.mu.Lock()
		defer h.kc.mu.Unlock()
		return len(h.kc.queues) == 0
	})
	ssCheckTopic(t, h.addrs, "a", len(rowsA))
	// B's given-up batch went out after all (a duplicate window, as
	// documented for records given up on at stop): all of it or none.
	got := kafkatest.ReadAll(t, h.addrs, "b", len(rowsB), 2*time.Second)
	require.Contains(t, []int{0, len(rowsB)}, len(got), "B's one batch whole or not at all")
}

// Attack: the client is replaced (renew after ErrOutOfBrokers) while a
// queue holds batches keyed by the old client's broker. The old queue's
// batches fail (the old broker is closed) and are retried on the new
// client; every record arrives once, in order.
func TestSharedSendAttackClientReplacedWhileQueued(t *testing.T) {
	h := newSSHarness(t, map[string]int32{"a": 1, "b": 1, "c": 1}, nil)
	var holdOne atomic.Bool
	g := h.gate(func(req *kmsg.ProduceRequest) bool { return holdOne.CompareAndSwap(false, true) })
	pA, pB, pC := h.producer(), h.producer(), h.producer()
	for _, p := range []*producer{pA, pB, pC} {
		warm(t, p, "a", "b", "c")
	}
	old := h.kc.get()
	rows := map[string][]row{"a": ssRows("a", "a", 3, 0, 30, 40), "b": ssRows("b", "b", 3, 0, 30, 40), "c": ssRows("c", "c", 3, 0, 30, 40)}
	var wg sync.WaitGroup
	wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), pA, rows["a"], 40) })
	waitUntil(t, "the broker holds A's first request", func() bool { return g.held.Load() == 1 })
	wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), pB, rows["b"], 40) })
	wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), pC, rows["c"], 40) })
	waitUntil(t, "B's and C's batches wait in the old broker's queue", func() bool { return h.kc.queued() == 2 })
	replaced := make(chan error, 1)
	go func() { replaced <- h.kc.replace(context.Background(), old) }()
	// replace closes the old client, whose broker waits for the held
	// request: let it go once the old client is gone from kc.
	waitUntil(t, "the old client is dropped", func() bool { return h.kc.get() != old })
	g.open()
	require.NoError(t, <-replaced)
	wg.Wait()
	for topic, rs := range rows {
		ssCheckTopic(t, h.addrs, topic, len(rs))
	}
	h.checkRequests()
}

// Attack: take's limits. More than maxRoundBytes waiting, of several
// partitions and producers; a batch alone larger than maxRoundBytes; two
// batches of one partition. Every request: at most one batch per
// partition; at most maxRoundBytes unless it is one batch; a partition's
// batches leave in the order they came; everything leaves.
func TestSharedSendAttackTakeLimits(t *testing.T) {
	mk := func(topic string, part int32, bytes int, out chan<- chunkResult) queuedBatch {
		return queuedBatch{c: &chunk{tp: topicPartition{topic, part}, bytes: bytes}, out: out}
	}
	out := make(chan chunkResult)
	big := maxRoundBytes + 1
	third := maxRoundBytes / 3
	q := &sendQueue{}
	var all []queuedBatch
	// small p0, huge p1, thirds over p2..p5, a second p0, a huge p0, small p1.
	all = append(all, mk("t", 0, 100, out), mk("t", 1, big, out))
	for p := int32(2); p < 6; p++ {
		all = append(all, mk("t", p, third, out))
	}
	all = append(all, mk("t", 0, 200, out), mk("t", 0, big, out), mk("t", 1, 50, out), mk("u", 0, third, out))
	q.waiting = append(q.waiting, all...)
	seen := map[topicPartition][]*chunk{}
	rounds := 0
	for len(q.waiting) > 0 {
		rounds++
		require.Less(t, rounds, 100, "take makes no progress")
		sent := q.take()
		require.NotEmpty(t, sent, "take returned nothing with batches waiting")
		total := 0
		parts := map[topicPartition]bool{}
		for _, x := range sent {
			require.False(t, parts[x.c.tp], "two batches of %v in one request", x.c.tp)
			parts[x.c.tp] = true
			total += x.c.bytes
			seen[x.c.tp] = append(seen[x.c.tp], x.c)
		}
		if len(sent) > 1 {
			require.LessOrEqual(t, total, maxRoundBytes, "request of %d batches over maxRoundBytes", len(sent))
		}
	}
	// Per partition, the order they came.
	want := map[topicPartition][]*chunk{}
	for _, x := range all {
		want[x.c.tp] = append(want[x.c.tp], x.c)
	}
	require.Equal(t, want, seen)
}

// Attack: a relay alone (its own client) still sends one request per
// broker per round: a send whose rows need k batches on its busiest
// partition takes exactly k requests.
func TestSharedSendAttackSingleRelayOneRequestPerRound(t *testing.T) {
	h := newSSHarness(t, map[string]int32{"solo": 3}, nil)
	p, err := newProducer(context.Background(), h.addrs, h.conf, nil)
	require.NoError(t, err)
	t.Cleanup(p.close)
	require.True(t, p.owned)
	rows := ssRows("solo", "s", 6, 0, 40, 60)
	r := ssRelay(5 * time.Second)
	before := len(h.requests())
	outcome, stopped := r.sendBatch(context.Background(), p, rows, 0)
	require.False(t, stopped)
	for i := range rows {
		require.NoError(t, outcome[i])
	}
	// The rounds sendBatch needs: the most batches any partition needs.
	perPart := map[int32]int{}
	parts, err := p.partitions(context.Background(), "solo")
	require.NoError(t, err)
	sizes := map[int32][]int{}
	for i := range rows {
		m := toMessage(&rows[i])
		part, err := p.partition(m, parts)
		require.NoError(t, err)
		sizes[part] = append(sizes[part], m.ByteSize(2))
	}
	rounds := 0
	for part, ss := range sizes {
		n, cur := 1, recordBatchOverhead
		for i, s := range ss {
			if i > 0 && cur+s > h.conf.Producer.MaxMessageBytes {
				n++
				cur = recordBatchOverhead
			}
			cur += s
		}
		perPart[part] = n
		rounds = max(rounds, n)
	}
	got := len(h.requests()) - before
	require.Equal(t, rounds, got, "requests for a send of %v batches per partition", perPart)
	ssCheckTopic(t, h.addrs, "solo", len(rows))
}

// Attack: more than maxRoundBytes waiting at once (three producers' large
// batches over eight partitions), and one batch alone larger than
// maxRoundBytes. The broker sees no request over maxRoundBytes of record
// bytes unless it holds one batch, the big batch goes (alone), and every
// record arrives once, each key's in order.
func TestSharedSendAttackOverRoundBytes(t *testing.T) {
	huge := strconv.Itoa(20 << 20)
	h := newSSHarness(t, map[string]int32{"big": 8, "huge": 1},
		map[string]map[string]*string{"huge": {"max.message.bytes": &huge}, "big": {"max.message.bytes": &huge}})
	h.conf.Producer.MaxMessageBytes = 20 << 20
	var first atomic.Bool
	h.c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		h.c.KeepControl()
		if first.CompareAndSwap(false, true) {
			time.Sleep(700 * time.Millisecond) // everything else gathers behind it
		}
		return nil, nil, false
	})
	var ps []*producer
	for range 4 {
		p := h.producer()
		warm(t, p, "big", "huge")
		ps = append(ps, p)
	}
	const keys, rounds, pad = 16, 4, 200 << 10
	var wg sync.WaitGroup
	// A small decoy request goes first and is held.
	wg.Go(func() {
		out, stopped := ssRelay(5*time.Second).sendBatch(context.Background(), ps[0], ssRows("huge", "decoy", 1, 0, 1, 0), 0)
		require.False(t, stopped)
		require.NoError(t, out[0])
	})
	waitUntil(t, "the decoy's request is held", func() bool { return len(h.requests()) == 1 })
	for i := 1; i < 3; i++ {
		rows := ssRows("big", "p"+strconv.Itoa(i), keys, 0, rounds, pad)
		wg.Go(func() { ssSendAll(t, ssRelay(5*time.Second), ps[i], rows, len(rows)) })
	}
	hugeRow := ssRows("huge", "huge", 1, 0, 1, maxRoundBytes+(1<<20))
	var hugeOut map[int]error
	wg.Go(func() {
		var stopped bool
		hugeOut, stopped = ssRelay(5*time.Second).sendBatch(context.Background(), ps[3], hugeRow, 0)
		require.False(t, stopped)
	})
	wg.Wait()
	require.NoError(t, hugeOut[0], "the batch larger than maxRoundBytes")
	alone := false
	for i, r := range h.requests() {
		batches := 0
		for _, n := range r.parts {
			batches += n
		}
		if batches > 1 {
			require.LessOrEqual(t, r.bytes, maxRoundBytes+64<<10, "request %d: %d batches, %d bytes", i, batches, r.bytes)
		}
		if r.bytes > maxRoundBytes {
			alone = true
		}
	}
	require.True(t, alone, "the big batch went alone")
	var sizes []string
	for _, r := range h.requests() {
		sizes = append(sizes, fmt.Sprintf("%d pids %d parts %d KiB", len(r.pids), len(r.parts), r.bytes>>10))
	}
	t.Logf("requests: %v", sizes)
	h.checkRequests()
	ssCheckTopic(t, h.addrs, "big", 2*keys*rounds)
}
