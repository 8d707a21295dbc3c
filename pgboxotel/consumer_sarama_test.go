package pgboxotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
)

// consume runs one consumer-group member over topics with pgbox's adapter
// (dedup by the pgbox event id header, one transaction per message) until
// the returned stop is called or the test ends.
func consume(t *testing.T, pool *pgxpool.Pool, addrs []string, group string, topics []string, fn inbox.HandlerFunc) (stop func()) {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Consumer: group, Key: inbox.ByHeader("pgbox-event-id")})
	require.NoError(t, err)
	h, err := inboxsarama.NewHandler(pool, ib, fn, inboxsarama.Config{})
	require.NoError(t, err)

	cfg := kafkatest.Config()
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	cg, err := sarama.NewConsumerGroup(addrs, group, cfg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cg.Close()
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, topics, h); err != nil && ctx.Err() == nil {
				t.Logf("consume: %v", err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}
