package inboxsarama_test

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/testutil"
)

// sends builds n records of which about a fifth resend an earlier event id
// (same payload, a different record key, so resends land on other partitions
// and race their originals across members). It returns the records and the
// number of distinct events.
func sends(topic, prefix string, n int, rng *rand.Rand) ([]*sarama.ProducerMessage, int) {
	msgs := make([]*sarama.ProducerMessage, n)
	unique := 0
	for i := range msgs {
		ev := fmt.Sprintf("%s-%05d", prefix, unique)
		if unique > 0 && rng.IntN(5) == 0 {
			ev = fmt.Sprintf("%s-%05d", prefix, rng.IntN(unique))
		} else {
			unique++
		}
		m := record(topic, ev)
		m.Key = sarama.StringEncoder(fmt.Sprintf("send-%d", i))
		msgs[i] = m
	}
	return msgs, unique
}

// Members join and leave one group while 10k records are produced, a fifth
// of them resends of an earlier event id: every event has exactly one
// business row.
func TestConsumerRebalancesWithResends(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	msgs, unique := sends(b.Topic, "ev", 10_000, rng)

	ib := newTestInbox(t, "svc", inbox.ByHeader(eventHeader))
	var handlers []*inboxsarama.Handler
	var batchN atomic.Int64
	join := func() *member {
		// Alternate batch sizes, so both paths meet in one group.
		batch := []int{50, 1, 20}[batchN.Add(1)%3]
		h := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})
		handlers = append(handlers, h)
		return startMember(t, b.Addrs, "svc", []string{b.Topic}, h)
	}
	chunk := func(i int) { b.Produce(t, msgs[i*1000:(i+1)*1000]...) }

	a := join()
	chunk(0)
	chunk(1)
	bm := join() // rebalance: a and bm share the partitions
	chunk(2)
	chunk(3)
	a.stop() // rebalance: bm takes everything, mid-stream
	chunk(4)
	cm := join()
	chunk(5)
	chunk(6)
	bm.stop()
	dm := join()
	chunk(7)
	chunk(8)
	cm.stop()
	chunk(9)
	testutil.Eventually(t, 90*time.Second, "every event processed", func() bool {
		_, distinct := b.Effects(t)
		return distinct == unique
	})
	dm.stop()

	rows, distinct := b.Effects(t)
	require.Equal(t, unique, distinct)
	require.Equal(t, unique, rows, "no event has two business rows")
	var processed, dups uint64
	for _, h := range handlers {
		st := h.Stats()
		processed += st.Processed
		dups += st.Duplicates
	}
	require.EqualValues(t, unique, processed)
	require.GreaterOrEqual(t, dups, uint64(len(msgs)-unique), "every resend was a duplicate")
}

// The same with sarama's cooperative-sticky strategy, where a rebalance
// revokes single claims (their Messages channel closes) while the session,
// and the other claims, go on.
func TestConsumerCooperativeRebalance(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	msgs, unique := sends(b.Topic, "ev", 3000, rng)

	ib := newTestInbox(t, "svc", inbox.ByHeader(eventHeader))
	var handlers []*inboxsarama.Handler
	join := func(batch int) *member {
		h := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})
		handlers = append(handlers, h)
		// Each member gets its own config and strategy, as separate
		// processes do: sarama's sticky strategies keep state in the
		// strategy value (Plan writes it), so one value shared by several
		// members in a process is a data race (this test's old one).
		cfg := cgConfig()
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
		return startMemberConfig(t, cfg, b.Addrs, "svc", []string{b.Topic}, h)
	}
	a := join(20)
	b.Produce(t, msgs[:1000]...)
	bm := join(1) // a keeps some partitions, gives up others
	b.Produce(t, msgs[1000:2000]...)
	a.stop()
	cm := join(50)
	b.Produce(t, msgs[2000:]...)
	testutil.Eventually(t, 90*time.Second, "every event processed", func() bool {
		_, distinct := b.Effects(t)
		return distinct == unique
	})
	bm.stop()
	cm.stop()

	rows, distinct := b.Effects(t)
	require.Equal(t, unique, distinct)
	require.Equal(t, unique, rows, "no event has two business rows")
	var processed uint64
	for _, h := range handlers {
		processed += h.Stats().Processed
	}
	require.EqualValues(t, unique, processed)
}
