package pgboxprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/pgboxprom"
)

// The collector exports the counters of a franz-go consumer as it does a
// sarama one's (Config.Consumer takes either adapter).
func TestConsumerCountersOfTheFranzAdapter(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	kc := kafkatest.New(t, kfake.SeedTopics(1, "events"))
	ctx := context.Background()
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("events"))
	require.NoError(t, err)
	for i := range 5 {
		require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Value: []byte{byte(i)}}).FirstErr())
	}
	prod.Close()

	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByOffset()})
	require.NoError(t, err)
	c, err := inboxfranz.NewConsumer(db.Pool, ib, func(context.Context, pgx.Tx, inbox.Message) error { return nil },
		inboxfranz.Config{},
		kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumerGroup("svc"), kgo.ConsumeTopics("events"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	require.NoError(t, err)
	defer c.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testutil.Eventually(t, 30*time.Second, "five processed", func() bool { return c.Stats().Processed == 5 })
	cancel()
	require.NoError(t, <-done)

	got := gather(t, newCollector(t, pgboxprom.Config{Consumer: c}))
	require.Equal(t, 5.0, got["pgbox_consumer_processed_total"])
	require.Equal(t, 0.0, got["pgbox_consumer_dead_lettered_total"])
}
