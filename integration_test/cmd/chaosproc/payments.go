package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// Payment is the payments service's event, published downstream.
type Payment struct {
	OrderID string `json:"order_id"`
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
	Amount  int64  `json:"amount"`
}

// ConsumerName is the payments service's inbox consumer name.
const ConsumerName = "payments-svc"

// insertPaymentSQL is the business effect. The table has no unique
// constraint on order_id on purpose: only the inbox stands between a
// redelivery and a second charge.
const insertPaymentSQL = `INSERT INTO payments (order_id, account, seq, amount, event_id, src_partition, src_offset, member)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

type paymentsService struct {
	topic  string
	member string
}

// runPayments runs one member of the payments consumer group until SIGTERM.
func runPayments(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("payments", flag.ContinueOnError)
	db := fs.String("db", "", "database URL (required)")
	brokers := fs.String("brokers", "", "comma-separated brokers (required)")
	group := fs.String("group", "payments-svc", "consumer group")
	in := fs.String("topic", "orders.v1", "topics consumed, comma-separated")
	out := fs.String("out-topic", "payments.v1", "topic the payment events go to")
	member := fs.String("member", "m0", "this member's name (logs, payments.member)")
	batch := fs.Int("batch", 16, "messages per transaction")
	dedup := fs.String("dedup", "keys", "inbox mode: keys (event-id keys) or watermark (offset watermark plus event-id keys)")
	client := fs.String("client", "sarama", "Kafka client: sarama (inbox/inboxsarama) or franz (inbox/inboxfranz)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(*db)
	if err != nil {
		return fmt.Errorf("payments: --db: %w", err)
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("payments: pool: %w", err)
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool); err != nil {
		return fmt.Errorf("payments: %w", err)
	}
	icfg := inbox.Config{Consumer: ConsumerName, Key: inbox.ByHeader(relay.EventIDHeader)}
	switch *dedup {
	case "keys":
	case "watermark":
		// Redeliveries stop at the partition's watermark; the relays'
		// duplicates (at least once: a relay killed between send and
		// delete sends again) sit at new offsets and need the event-id keys.
		icfg.Dedup = inbox.DedupWatermarkAndKeys
	default:
		return fmt.Errorf("payments: --dedup=%q: want keys or watermark", *dedup)
	}
	ib, err := inbox.New(icfg)
	if err != nil {
		return err
	}
	s := &paymentsService{topic: *out, member: *member}
	m := groupMember{group: *group, member: *member, brokers: splitList(*brokers), topics: splitList(*in), batch: *batch}
	log.Info("payments member starting", "member", *member, "group", *group, "topic", *in, "client", *client)
	stats, err := m.run(ctx, *client, log.With("component", "consumer", "client", *client), pool, ib, s.charge)
	if err != nil {
		return err
	}
	log.Info("payments member stopping", "stats", stats)
	return nil
}

// charge is the business effect and its event, inside the adapter's tx.
func (s *paymentsService) charge(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	var o Order
	if err := json.Unmarshal(m.Value, &o); err != nil {
		return permanent(fmt.Errorf("order at %s/%d@%d is not JSON: %w", m.Topic, m.Partition, m.Offset, err))
	}
	var eventID string
	for _, h := range m.Headers {
		if h.Key == relay.EventIDHeader {
			eventID = string(h.Value)
		}
	}
	if _, err := tx.Exec(ctx, insertPaymentSQL, o.OrderID, o.Account, o.Seq, o.Amount, eventID, m.Partition, m.Offset, s.member); err != nil {
		return fmt.Errorf("insert payment for %s: %w", o.OrderID, err)
	}
	v, _ := json.Marshal(Payment(o))
	return outbox.Write(ctx, tx, outbox.Message{Topic: s.topic, Key: []byte(o.Account), Value: v,
		Headers: []outbox.Header{{Key: "order-id", Value: []byte(o.OrderID)}}})
}

func consumerConfig(member string) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "payments-" + member
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = time.Second
	c.Consumer.Retry.Backoff = 100 * time.Millisecond
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Metadata.Retry.Max = 10
	c.Net.DialTimeout = 2 * time.Second
	return c
}

func logStats(ctx context.Context, log *slog.Logger, stats func() string) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			log.Info("consumer stats", "stats", stats())
		}
	}
}

func fmtStats(s inbox.ConsumerStats) string {
	return fmt.Sprintf("processed=%d duplicates=%d failures=%d transient=%d dead_lettered=%d", s.Processed, s.Duplicates, s.Failures, s.TransientErrors, s.DeadLettered)
}
