// Package harness is everything of the demo that is not the payment service:
// the Kafka broker and topics, the demo schema, the order producer that
// injects duplicates (resends and a replay from an earlier offset), the
// payments reader that checks one payment per order and measures latency,
// the progress line and the summary. examples/demo's service.go is the
// service itself.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// OrderIDHeader is the header the producer puts each order's id in: the
// payment service keys its inbox by it, so a resend or a replay of an order
// is the same key.
const OrderIDHeader = "order-id"

// Order is a record of the orders topic.
type Order struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
	SentAtNanos int64  `json:"sent_at_unix_nano"`
}

// Payment is a record of the payments topic.
type Payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
	OrderSentAt int64  `json:"order_sent_at_unix_nano"`
}

// Config is the demo's own settings (flags and PGBOX_DEMO_… variables).
type Config struct {
	Schema       string
	Orders       int
	DupPercent   int
	Replay       int
	Rate         int
	Partitions   int
	Consumers    int
	Duration     time.Duration
	KeepSchema   bool
	PaymentTopic string
	OrderTopic   string
	DedupKey     string
}

// Service is what the harness watches of the service under test.
type Service struct {
	Pool     *pgxpool.Pool
	Consumer interface{ Stats() inbox.ConsumerStats }
	Relay    interface{ Stats() outbox.RelayStats }
}

// counters are what the progress line and the summary show.
type counters struct {
	sent, resent, replayed atomic.Int64
	paymentsRead           atomic.Int64
	paymentsUnique         atomic.Int64
}

// Harness drives one demo run.
type Harness struct {
	cfg    Config
	log    *slog.Logger
	stdout io.Writer
	kcfg   *sarama.Config
	kdesc  string // the Kafka settings, for errors (no password)

	// Brokers are the Kafka bootstrap brokers; Orders, Payments and Group
	// the topics' and the consumer group's names (fresh ones on a real
	// cluster). Set by StartKafka.
	Brokers                 []string
	Orders, Payments, Group string

	svc      Service
	counters counters

	mu        sync.Mutex
	latencies []time.Duration
	seen      map[string]map[string]struct{} // order id → payment event ids
	latDone   map[string]bool
	claims    map[int]int // member → partitions claimed in its current session
}

// New returns a harness for cfg. kcfg holds the client settings every Kafka
// client of the demo shares (version, SASL, TLS); kdesc describes them
// without secrets.
func New(cfg Config, kcfg *sarama.Config, kdesc string, log *slog.Logger, stdout io.Writer) *Harness {
	return &Harness{cfg: cfg, log: log, stdout: stdout, kcfg: kcfg, kdesc: kdesc,
		seen: map[string]map[string]struct{}{}, latDone: map[string]bool{}, claims: map[int]int{}}
}

// Watch tells the harness what to watch once the service runs.
func (h *Harness) Watch(s Service) { h.svc = s }

// StartKafka starts the embedded broker with the demo's topics, or, with
// brokers given, creates fresh topics there. It returns where Kafka is and a
// func that stops the embedded broker.
func (h *Harness) StartKafka(brokers []string) (where string, stop func(), err error) {
	h.Orders, h.Payments, h.Group = h.cfg.OrderTopic, h.cfg.PaymentTopic, "demo-payments-svc"
	if len(brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1),
			kfake.SeedTopics(int32(h.cfg.Partitions), h.Orders, h.Payments, h.Orders+inbox.DeadLetterSuffixDefault))
		if err != nil {
			return "", nil, fmt.Errorf("start embedded Kafka broker: %w", err)
		}
		h.Brokers = c.ListenAddrs()
		return "embedded Kafka-protocol broker (kfake)", c.Close, nil
	}
	h.Brokers = brokers
	// A real cluster keeps earlier runs' records: use fresh topics and group.
	suffix := fmt.Sprintf("-%d", time.Now().Unix())
	h.Orders += suffix
	h.Payments += suffix
	h.Group += suffix
	if err := h.createTopics(); err != nil {
		return "", nil, err
	}
	return "Kafka at " + strings.Join(brokers, ","), func() {}, nil
}

func (h *Harness) createTopics() error {
	admin, err := sarama.NewClusterAdmin(h.Brokers, h.kcfg)
	if err != nil {
		return fmt.Errorf("kafka admin (%s): %w", h.kdesc, err)
	}
	defer admin.Close()
	for _, t := range []string{h.Orders, h.Payments, h.Orders + inbox.DeadLetterSuffixDefault} {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: int32(h.cfg.Partitions), ReplicationFactor: -1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

// ResetSchema drops and recreates the demo's schema through admin (a pool
// on the database's own search_path).
func (h *Harness) ResetSchema(ctx context.Context, admin *pgxpool.Pool) error {
	schema := pgx.Identifier{h.cfg.Schema}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return fmt.Errorf("reset demo schema %s: %w", schema, err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create demo schema %s: %w", schema, err)
	}
	return nil
}

// DropSchema drops the demo's schema through admin.
func (h *Harness) DropSchema(ctx context.Context, admin *pgxpool.Pool) {
	_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{h.cfg.Schema}.Sanitize()+" CASCADE")
}

// ConsumerConfig is the sarama config of the demo's consumers: the shared
// client settings, from the oldest offset, short backoffs.
func (h *Harness) ConsumerConfig() *sarama.Config {
	c := *h.kcfg
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Consumer.Retry.Backoff = 50 * time.Millisecond
	c.Metadata.Retry.Backoff = 50 * time.Millisecond
	return &c
}

// memberHandler is the adapter as one group member sees it; Setup records
// the member's claims so the producer can wait for a settled group (the
// latency figures then measure the pipeline, not the group's first join).
type memberHandler struct {
	sarama.ConsumerGroupHandler
	h      *Harness
	member int
}

func (m memberHandler) Setup(sess sarama.ConsumerGroupSession) error {
	n := 0
	for _, ps := range sess.Claims() {
		n += len(ps)
	}
	m.h.mu.Lock()
	m.h.claims[m.member] = n
	m.h.mu.Unlock()
	return m.ConsumerGroupHandler.Setup(sess)
}

// Member wraps the service's consumer-group handler for group member i, so
// the harness sees when the group has settled.
func (h *Harness) Member(handler sarama.ConsumerGroupHandler, i int) sarama.ConsumerGroupHandler {
	return memberHandler{handler, h, i}
}

// groupSettled reports whether every member has a session and together they
// claim every partition.
func (h *Harness) groupSettled() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	total := 0
	for _, n := range h.claims {
		total += n
	}
	return len(h.claims) == h.cfg.Consumers && total == h.cfg.Partitions
}

// WaitSettled lets the consumer group settle (every member joined,
// partitions assigned) before the producer sends, at most a few seconds.
func (h *Harness) WaitSettled(ctx context.Context) {
	settle := time.Now().Add(10 * time.Second)
	for !h.groupSettled() && time.Now().Before(settle) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitHandled waits until every delivery the producer made is handled and
// every order's payment read back, or an error arrives on errs.
func (h *Harness) WaitHandled(ctx context.Context, errs <-chan error) error {
	expected := h.counters.sent.Load() + h.counters.resent.Load() + h.counters.replayed.Load()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st := h.svc.Consumer.Stats()
		if int64(st.Processed+st.Duplicates+st.DeadLettered) >= expected && h.counters.paymentsUnique.Load() >= int64(h.cfg.Orders) {
			break
		}
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	// Linger briefly so a duplicate payment, if any, is seen too.
	time.Sleep(300 * time.Millisecond)
	return nil
}

// Status is the progress line's text.
func (h *Harness) Status() string {
	st := h.svc.Consumer.Stats()
	backlog := h.svc.Relay.Stats().Backlog
	return fmt.Sprintf("orders sent %d/%d (+%d resent, +%d replayed) | delivered %d | duplicates skipped %d | outbox backlog %d | payments read %d",
		h.counters.sent.Load(), h.cfg.Orders, h.counters.resent.Load(), h.counters.replayed.Load(),
		st.Processed+st.Duplicates, st.Duplicates, backlog, h.counters.paymentsRead.Load())
}
