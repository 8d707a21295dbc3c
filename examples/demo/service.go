package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/examples/demo/internal/harness"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
)

// The payment service: all a service writes to use pgbox. It consumes
// orders and charges each one exactly once, although the orders topic
// carries duplicates (internal/harness injects them and checks the result).
//
//  1. migrate: pgbox's tables (migrations.Up), beside the service's own.
//  2. consume: for each delivery the consumer-group adapter begins a
//     transaction and runs inbox.Process in it, which records the order id
//     and calls charge, or skips a duplicate; then it commits and marks the
//     offset.
//  3. charge: the business write and outbox.Write of the payment event, in
//     that same transaction. The relay (wiring.go) publishes the payment.

// consumerName names the service in the inbox: its keys are its own.
const consumerName = "payments-svc"

// chargesTableSQL is the service's business table. It deliberately has no
// unique constraint on order_id: only the inbox stands between a duplicate
// delivery and a double charge.
const chargesTableSQL = `CREATE TABLE demo_charges (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id     text   NOT NULL,
	customer     text   NOT NULL,
	amount_cents bigint NOT NULL,
	charged_at   timestamptz NOT NULL DEFAULT now()
)`

// migrate applies pgbox's migrations and creates the business table.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, chargesTableSQL); err != nil {
		return fmt.Errorf("create demo_charges: %w", err)
	}
	return nil
}

// paymentService charges orders and announces payments on paymentsTopic.
type paymentService struct {
	paymentsTopic string
}

// newConsumer returns the service's consumer-group handler: the inbox keys
// each delivery by its order-id header (a resend or a replay is the same
// order), or with dedupKey "offset" by its Kafka offset (which cannot see
// that, and the demo's check fails).
func (s paymentService) newConsumer(pool *pgxpool.Pool, dedupKey string, log *slog.Logger) (*inbox.Inbox, *inboxsarama.Handler, error) {
	key := inbox.ByHeader(harness.OrderIDHeader)
	if dedupKey == "offset" {
		key = inbox.ByOffset()
	}
	ib, err := inbox.New(inbox.Config{Consumer: consumerName, Key: key})
	if err != nil {
		return nil, nil, err
	}
	h, err := inboxsarama.NewHandler(pool, ib, s.charge, consumerSettings(log))
	return ib, h, err
}

// charge is the handler inbox.Process calls inside the consumer's
// transaction once it has recorded the order id: it charges the order and
// writes the payment event to the outbox. Both commit with the inbox key, or
// neither does.
func (s paymentService) charge(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	var o harness.Order
	if err := json.Unmarshal(m.Value, &o); err != nil {
		return inbox.Permanent(fmt.Errorf("order at %s/%d@%d is not JSON: %w", m.Topic, m.Partition, m.Offset, err))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO demo_charges (order_id, customer, amount_cents) VALUES ($1, $2, $3)`,
		o.OrderID, o.Customer, o.AmountCents); err != nil {
		return err
	}
	v, _ := json.Marshal(harness.Payment{OrderID: o.OrderID, AmountCents: o.AmountCents, Status: "charged", OrderSentAt: o.SentAtNanos})
	return outbox.Write(ctx, tx, outbox.Message{Topic: s.paymentsTopic, Key: []byte(o.OrderID), Value: v,
		Headers: []outbox.Header{{Key: harness.OrderIDHeader, Value: []byte(o.OrderID)}}})
}
