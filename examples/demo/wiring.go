package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/relay"
)

// How the service's pgbox parts meet Kafka: the consumer adapter's settings
// and its group loop, the relay's producer, cleanup's admin client.

// consumerSettings are the consumer adapter's settings.
func consumerSettings(log *slog.Logger) inboxsarama.Config {
	return inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 16, Logger: log.With("component", "consumer")}}
}

// consume runs one member of the service's consumer group until ctx ends.
// member wraps the handler so the harness sees the group settle.
func consume(ctx context.Context, brokers []string, group, topic string, cfg *sarama.Config,
	handler sarama.ConsumerGroupHandler, log *slog.Logger) error {
	g, err := sarama.NewConsumerGroup(brokers, group, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{topic}, handler); err != nil && ctx.Err() == nil {
			log.Warn("consumer group session ended", "error", err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// newRelay returns the relay that publishes the outbox: relay.NewKafkaConfig's
// producer settings (WaitForAll acks, retries) on top of the client settings (SASL, TLS) the
// demo shares, and short intervals for a demo.
func newRelay(pool *pgxpool.Pool, brokers []string, base *sarama.Config, log *slog.Logger) (*relay.Relay, error) {
	rk := relay.NewKafkaConfig()
	rk.Version, rk.ClientID, rk.Net, rk.Metadata = base.Version, base.ClientID, base.Net, base.Metadata
	rk.Net.MaxOpenRequests = 1
	rk.Metadata.Retry.Backoff = 50 * time.Millisecond
	rk.Producer.Retry.Backoff = 50 * time.Millisecond
	return relay.New(relay.Config{
		Pool: pool, Brokers: brokers, Kafka: rk, Lanes: 4,
		PollInterval: 100 * time.Millisecond, HeartbeatInterval: 250 * time.Millisecond, LeaseTTL: time.Second,
		Logger: log.With("component", "relay"),
	})
}

// cleanupOnce runs one cleanup pass, as an operator's cron would.
func cleanupOnce(ctx context.Context, pool *pgxpool.Pool, brokers []string, kcfg *sarama.Config, kdesc string, log *slog.Logger) (cleanup.Report, error) {
	admin, err := sarama.NewClusterAdmin(brokers, kcfg)
	if err != nil {
		return cleanup.Report{}, fmt.Errorf("kafka admin (%s): %w", kdesc, err)
	}
	defer admin.Close()
	cl, err := cleanup.New(cleanup.Config{Pool: pool, Admin: cleanupsarama.New(admin), Logger: log.With("component", "cleanup")})
	if err != nil {
		return cleanup.Report{}, err
	}
	return cl.RunOnce(ctx)
}
