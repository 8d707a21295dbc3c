package inboxsarama_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/testutil"
)

// With sarama's cooperative-sticky strategy, a rebalance revokes single
// claims (their Messages channel closes) while the session, and the other
// claims, go on; every event has exactly one business row. (The eager
// strategies, and franz-go's: inbox/internal/consume.TestSuiteRebalancesWithResends.)
func TestConsumerCooperativeRebalance(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 4)
	rng := rand.New(rand.NewPCG(5, 6))
	msgs, unique := consumetest.Resends(b.Topic, "ev", 3000, rng)

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
