package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/outbox"
)

// Order is the orders service's event: seq counts the account's orders from
// 1, so a consumer can tell a lost, repeated or reordered event.
type Order struct {
	OrderID string `json:"order_id"`
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
	Amount  int64  `json:"amount"`
}

const (
	insertOrderSQL = `INSERT INTO orders (order_id, account, seq, amount) VALUES ($1, $2, $3, $4)`
	orderStateSQL  = `SELECT account, max(seq) FROM orders GROUP BY account`
)

type ordersService struct {
	log      *slog.Logger
	pool     *pgxpool.Pool
	topics   []string
	accounts int
	next     map[string]int64 // account → last committed seq
	total    int64
}

// runOrders writes --events orders in total (counting those committed by
// earlier runs of the process) at --rate per second, each in its own
// transaction with its outbox event, then exits.
func runOrders(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	db := fs.String("db", "", "database URL (required)")
	events := fs.Int64("events", 1000, "orders to have committed in total")
	rate := fs.Float64("rate", 100, "orders per second")
	accounts := fs.Int("accounts", 100, "accounts (Kafka keys)")
	topic := fs.String("topic", "orders.v1", "topic of the order events; a comma-separated list spreads accounts over several")
	seed := fs.Uint64("seed", 1, "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(*db)
	if err != nil {
		return fmt.Errorf("orders: --db: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("orders: pool: %w", err)
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool); err != nil {
		return fmt.Errorf("orders: %w", err)
	}
	s := &ordersService{log: log, pool: pool, topics: strings.Split(*topic, ","), accounts: *accounts}
	rng := rand.New(rand.NewPCG(*seed, 7))
	for !s.reload(ctx) {
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	log.Info("orders starting", "committed", s.total, "target", *events, "rate", *rate)
	start, base := time.Now(), s.total
	for s.total < *events {
		// Pace: order number n is due at start + (n-base)/rate.
		due := start.Add(time.Duration(float64(s.total-base) / *rate * float64(time.Second)))
		if err := sleep(ctx, time.Until(due)); err != nil {
			return err
		}
		n := rng.IntN(s.accounts)
		acct := fmt.Sprintf("acct-%04d", n)
		if err := s.write(ctx, acct, s.topics[n%len(s.topics)], 100+rng.Int64N(10000)); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The commit's outcome may be unknown: read back what is there.
			log.Warn("order not written; reloading state", "account", acct, "err", err)
			_ = sleep(ctx, 200*time.Millisecond)
			for !s.reload(ctx) && ctx.Err() == nil {
				_ = sleep(ctx, 200*time.Millisecond)
			}
		}
	}
	log.Info("orders done", "committed", s.total)
	return nil
}

// write commits one order of acct and its event on topic (an account's
// events always go to one topic, so their order is defined).
func (s *ordersService) write(ctx context.Context, acct, topic string, amount int64) error {
	o := Order{Account: acct, Seq: s.next[acct] + 1, Amount: amount}
	o.OrderID = fmt.Sprintf("%s-%06d", acct, o.Seq)
	v, _ := json.Marshal(o)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertOrderSQL, o.OrderID, o.Account, o.Seq, o.Amount); err != nil {
			return fmt.Errorf("insert order %s: %w", o.OrderID, err)
		}
		return outbox.Write(ctx, tx, outbox.Message{Topic: topic, Key: []byte(acct), Value: v,
			Headers: []outbox.Header{{Key: "order-id", Value: []byte(o.OrderID)}}})
	})
	if err != nil {
		return err
	}
	s.next[acct] = o.Seq
	s.total++
	return nil
}

// reload reads every account's last seq and the total from the database.
func (s *ordersService) reload(ctx context.Context) bool {
	rows, err := s.pool.Query(ctx, orderStateSQL)
	if err != nil {
		s.log.Warn("read order state", "err", err)
		return false
	}
	next := map[string]int64{}
	var total int64
	for rows.Next() {
		var a string
		var n int64
		if err := rows.Scan(&a, &n); err != nil {
			rows.Close()
			return false
		}
		next[a] = n
		total += n
	}
	if rows.Err() != nil {
		s.log.Warn("read order state", "err", rows.Err())
		return false
	}
	s.next, s.total = next, total
	return true
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
