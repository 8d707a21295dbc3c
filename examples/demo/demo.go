package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// The demo: a payment service consumes orders and charges each one exactly
// once, even though the orders topic carries duplicates.
//
//	producer ──orders (+ resends, + a replay)──► Kafka ──► consumer group (2 members)
//	   BEGIN; inbox.Process (key: order-id header); INSERT demo_charges; outbox.Write payment; COMMIT
//	relay ──payments──► Kafka ──► verifier (one payment per order? latency)
//	cleanup: one pass at the end
const (
	demoConsumer    = "payments-svc"
	demoOrderHeader = "order-id"
)

// demoSchemaSQL is the demo service's own business table. It deliberately has
// no unique constraint on order_id: only the inbox stands between a
// duplicate delivery and a double charge.
const demoSchemaSQL = `CREATE TABLE demo_charges (
	id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id     text   NOT NULL,
	customer     text   NOT NULL,
	amount_cents bigint NOT NULL,
	charged_at   timestamptz NOT NULL DEFAULT now()
)`

type order struct {
	OrderID     string `json:"order_id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
	SentAtNanos int64  `json:"sent_at_unix_nano"`
}

type payment struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Status      string `json:"status"`
	OrderSentAt int64  `json:"order_sent_at_unix_nano"`
}

// demoCounters are what the progress line and the summary show.
type demoCounters struct {
	sent, resent, replayed atomic.Int64
	paymentsRead           atomic.Int64
	paymentsUnique         atomic.Int64
}

type demo struct {
	a       *app
	o       demoOptions
	log     *slog.Logger
	brokers []string
	kcfg    *sarama.Config
	orders  string // topic names
	pays    string
	group   string

	pool     *pgxpool.Pool
	ib       *inbox.Inbox
	handler  *inboxsarama.Handler
	relay    *relay.Relay
	counters demoCounters

	mu        sync.Mutex
	latencies []time.Duration
	seen      map[string]map[string]struct{} // order id → payment event ids
	latDone   map[string]bool
	claims    map[int]int // member → partitions claimed in its current session
}

// memberHandler is the adapter as one group member sees it; Setup records
// the member's claims so the producer can wait for a settled group (the
// latency figures then measure the pipeline, not the group's first join).
type memberHandler struct {
	*inboxsarama.Handler
	d      *demo
	member int
}

func (h memberHandler) Setup(sess sarama.ConsumerGroupSession) error {
	n := 0
	for _, ps := range sess.Claims() {
		n += len(ps)
	}
	h.d.mu.Lock()
	h.d.claims[h.member] = n
	h.d.mu.Unlock()
	return h.Handler.Setup(sess)
}

// groupSettled reports whether every member has a session and together they
// claim every partition.
func (d *demo) groupSettled() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	total := 0
	for _, n := range d.claims {
		total += n
	}
	return len(d.claims) == d.o.Consumers && total == d.o.Partitions
}

func cmdDemo(ctx context.Context, a *app, args []string) error {
	d := &demo{a: a, o: a.opts.Demo, seen: map[string]map[string]struct{}{}, latDone: map[string]bool{}, claims: map[int]int{}}
	// Library logs would tear the progress line: warnings and up only, unless
	// a level was asked for.
	d.log = a.log
	if !a.opts.logLevelSet {
		d.log = newLogger(a.stderr, a.opts.LogFormat, "warn")
	}
	ctx, cancel := context.WithTimeout(ctx, d.o.Duration)
	defer cancel()
	err := d.run(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("demo did not finish within PGBOX_DEMO_DURATION (--duration) %s: %w (raise it, or lower --orders)", d.o.Duration, err)
	}
	return err
}

func (d *demo) run(ctx context.Context) error {
	start := time.Now()
	prog := newProgress(d.a.stderr)

	// Kafka: embedded unless KAFKA_BROKERS is set.
	base, err := d.a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	d.kcfg = base
	d.orders, d.pays, d.group = d.o.OrderTopic, d.o.PaymentTopic, "demo-payments-svc"
	where := "embedded Kafka-protocol broker (kfake)"
	if len(d.a.opts.Kafka.Brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1),
			kfake.SeedTopics(int32(d.o.Partitions), d.orders, d.pays, d.orders+inboxsarama.DeadLetterSuffixDefault))
		if err != nil {
			return fmt.Errorf("start embedded Kafka broker: %w", err)
		}
		defer c.Close()
		d.brokers = c.ListenAddrs()
	} else {
		d.brokers = d.a.opts.Kafka.Brokers
		where = "Kafka at " + strings.Join(d.brokers, ",")
		// A real cluster keeps earlier runs' records: use fresh topics and group.
		suffix := fmt.Sprintf("-%d", time.Now().Unix())
		d.orders += suffix
		d.pays += suffix
		d.group += suffix
		if err := d.createTopics(); err != nil {
			return err
		}
	}
	prog.line("pgbox demo: %d orders (+%d%% resends, %d replayed) → %s, schema %q, inbox key: %s", d.o.Orders, d.o.DupPercent, d.o.Replay, where, d.o.Schema, d.o.DedupKey)

	if err := d.setupDB(ctx); err != nil {
		return err
	}
	defer d.pool.Close()
	if !d.o.KeepSchema {
		defer d.dropSchema()
	}

	// The service: inbox + consumer-group adapter; the relay; the verifier.
	key := inbox.ByHeader(demoOrderHeader)
	if d.o.DedupKey == "offset" {
		key = inbox.ByOffset()
	}
	d.ib, err = inbox.New(inbox.Config{Consumer: demoConsumer, Key: key})
	if err != nil {
		return err
	}
	d.handler, err = inboxsarama.NewHandler(d.pool, d.ib, d.charge, inboxsarama.Options{
		BatchSize: 16, Logger: d.log.With("component", "consumer"),
	})
	if err != nil {
		return err
	}
	// The relay's producer: relay.NewKafkaConfig's idempotent-producer
	// settings on top of the client settings (SASL, TLS) the demo shares.
	rk := relay.NewKafkaConfig()
	rk.Version, rk.ClientID, rk.Net, rk.Metadata = base.Version, base.ClientID, base.Net, base.Metadata
	rk.Net.MaxOpenRequests = 1
	rk.Metadata.Retry.Backoff = 50 * time.Millisecond
	rk.Producer.Retry.Backoff = 50 * time.Millisecond
	d.relay, err = relay.New(relay.Config{
		Pool: d.pool, Brokers: d.brokers, Kafka: rk, Lanes: 4,
		PollInterval: 100 * time.Millisecond, HeartbeatInterval: 250 * time.Millisecond, LeaseTTL: time.Second,
		Logger: d.log.With("component", "relay"),
	})
	if err != nil {
		return err
	}

	svcCtx, stopSvc := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// On every return: stop the service and wait for it before the pool and
	// the broker close.
	defer func() { stopSvc(); wg.Wait() }()
	errs := make(chan error, 8)
	wg.Go(func() {
		if err := d.relay.Run(svcCtx); err != nil {
			errs <- fmt.Errorf("relay: %w", err)
		}
	})
	for i := range d.o.Consumers {
		wg.Go(func() {
			if err := d.consume(svcCtx, i); err != nil && svcCtx.Err() == nil {
				errs <- err
			}
		})
	}
	wg.Go(func() {
		if err := d.verify(svcCtx); err != nil && svcCtx.Err() == nil {
			errs <- err
		}
	})
	if d.a.opts.HTTPAddr != "" {
		if err := d.serveMetrics(svcCtx, &wg); err != nil {
			return err
		}
	}
	stopProgress := prog.run(ctx, d.status)

	// Let the consumer group settle (both members joined, partitions
	// assigned) before sending, at most a few seconds.
	settle := time.Now().Add(10 * time.Second)
	for !d.groupSettled() && time.Now().Before(settle) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}

	// The producer: orders, resends, then a replay from an earlier offset.
	produceErr := d.produce(ctx)
	if produceErr == nil {
		produceErr = d.replay(ctx)
	}
	if produceErr != nil {
		stopProgress()
		return produceErr
	}
	expected := d.counters.sent.Load() + d.counters.resent.Load() + d.counters.replayed.Load()

	// Wait until every delivery is handled and every payment read back.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		st := d.handler.Stats()
		if int64(st.Processed+st.Duplicates+st.DeadLettered) >= expected && d.counters.paymentsUnique.Load() >= int64(d.o.Orders) {
			break
		}
		select {
		case err := <-errs:
			stopProgress()
			return err
		case <-ctx.Done():
			stopProgress()
			return ctx.Err()
		case <-tick.C:
		}
	}
	// Linger briefly so a duplicate payment, if any, is seen too.
	time.Sleep(300 * time.Millisecond)
	stopProgress()
	took := time.Since(start)

	// Cleanup runs once, as an operator's cron would.
	admin, err := sarama.NewClusterAdmin(d.brokers, d.kcfg)
	if err != nil {
		return fmt.Errorf("kafka admin (%s): %w", d.a.opts.Kafka.Redacted(), err)
	}
	defer admin.Close()
	cl, err := cleanup.New(cleanup.Config{Pool: d.pool, Admin: cleanupsarama.New(admin), Logger: d.log.With("component", "cleanup")})
	if err != nil {
		return err
	}
	cleanRep, cleanErr := cl.RunOnce(ctx)
	stopSvc()
	wg.Wait()
	if cleanErr != nil {
		return cleanErr
	}
	return d.summary(ctx, took, cleanRep)
}

func (d *demo) createTopics() error {
	admin, err := sarama.NewClusterAdmin(d.brokers, d.kcfg)
	if err != nil {
		return fmt.Errorf("kafka admin (%s): %w", d.a.opts.Kafka.Redacted(), err)
	}
	defer admin.Close()
	for _, t := range []string{d.orders, d.pays, d.orders + inboxsarama.DeadLetterSuffixDefault} {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: int32(d.o.Partitions), ReplicationFactor: -1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

// setupDB resets the demo schema, migrates it and adds the business table.
func (d *demo) setupDB(ctx context.Context) error {
	admin, err := d.a.openPool(ctx)
	if err != nil {
		return err
	}
	defer admin.Close()
	schema := pgx.Identifier{d.o.Schema}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return fmt.Errorf("reset demo schema %s: %w", schema, err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("create demo schema %s: %w", schema, err)
	}
	cfg, err := poolConfig(d.a.opts.DatabaseURL, d.o.Schema, max(d.a.opts.DBMaxConns, d.o.Consumers*d.o.Partitions+6))
	if err != nil {
		return err
	}
	d.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database: %s", dbconf.RedactErr(err, d.a.opts.DatabaseURL))
	}
	db := sqlDB(d.pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	if _, err := d.pool.Exec(ctx, demoSchemaSQL); err != nil {
		return fmt.Errorf("create demo_charges: %w", err)
	}
	return nil
}

func (d *demo) dropSchema() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := d.a.openPool(ctx)
	if err != nil {
		return
	}
	defer admin.Close()
	_, _ = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.o.Schema}.Sanitize()+" CASCADE")
}

// charge is the payment service's handler: inside the consumer's
// transaction, after the inbox recorded the order id, it charges the order
// and writes the payment event to the outbox.
func (d *demo) charge(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	var o order
	if err := json.Unmarshal(m.Value, &o); err != nil {
		return inboxsarama.Permanent(fmt.Errorf("order at %s/%d@%d is not JSON: %w", m.Topic, m.Partition, m.Offset, err))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO demo_charges (order_id, customer, amount_cents) VALUES ($1, $2, $3)`,
		o.OrderID, o.Customer, o.AmountCents); err != nil {
		return err
	}
	v, _ := json.Marshal(payment{OrderID: o.OrderID, AmountCents: o.AmountCents, Status: "charged", OrderSentAt: o.SentAtNanos})
	return outbox.Write(ctx, tx, outbox.Message{Topic: d.pays, Key: []byte(o.OrderID), Value: v,
		Headers: []outbox.Header{{Key: demoOrderHeader, Value: []byte(o.OrderID)}}})
}

func (d *demo) consumerConfig() *sarama.Config {
	c := *d.kcfg
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Consumer.Retry.Backoff = 50 * time.Millisecond
	c.Metadata.Retry.Backoff = 50 * time.Millisecond
	return &c
}

// consume runs one member of the payment service's consumer group.
func (d *demo) consume(ctx context.Context, member int) error {
	group, err := sarama.NewConsumerGroup(d.brokers, d.group, d.consumerConfig())
	if err != nil {
		return fmt.Errorf("consumer %d: %w", member, err)
	}
	defer group.Close()
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{d.orders}, memberHandler{d.handler, d, member}); err != nil && ctx.Err() == nil {
			d.log.Warn("consumer group session ended", "member", member, "error", err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func (d *demo) producer() (sarama.SyncProducer, error) {
	c := *d.kcfg
	c.Producer.Return.Successes = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Backoff = 50 * time.Millisecond
	p, err := sarama.NewSyncProducer(d.brokers, &c)
	if err != nil {
		return nil, fmt.Errorf("order producer: %w", err)
	}
	return p, nil
}

// produce sends the unique orders at --rate, each followed at once by a
// resend with the same order id for --duplicate-percent of them (a producer
// retrying after a timeout it could not tell from a failure).
func (d *demo) produce(ctx context.Context) error {
	p, err := d.producer()
	if err != nil {
		return err
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	const tick = 20 * time.Millisecond
	perTick := 200
	if d.o.Rate > 0 {
		perTick = max(1, d.o.Rate*int(tick)/int(time.Second))
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; i < d.o.Orders; {
		var batch []*sarama.ProducerMessage
		var resends int64
		for n := 0; n < perTick && i < d.o.Orders; n, i = n+1, i+1 {
			o := order{OrderID: fmt.Sprintf("ord-%06d", i), Customer: fmt.Sprintf("cust-%03d", rng.IntN(500)),
				AmountCents: 100 + rng.Int64N(99_900), SentAtNanos: time.Now().UnixNano()}
			v, _ := json.Marshal(o)
			m := &sarama.ProducerMessage{Topic: d.orders, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(v),
				Headers: []sarama.RecordHeader{{Key: []byte(demoOrderHeader), Value: []byte(o.OrderID)}}}
			batch = append(batch, m)
			if rng.IntN(100) < d.o.DupPercent {
				dup := *m
				batch = append(batch, &dup)
				resends++
			}
		}
		if err := p.SendMessages(batch); err != nil {
			return fmt.Errorf("send orders: %w", err)
		}
		d.counters.sent.Add(int64(len(batch)) - resends)
		d.counters.resent.Add(resends)
		if d.o.Rate > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// replay re-sends --replay records read back from an earlier offset of each
// partition (a mirror or a recovery script re-publishing a range): same key,
// value and headers, new offsets.
func (d *demo) replay(ctx context.Context) error {
	if d.o.Replay == 0 {
		return nil
	}
	client, err := sarama.NewClient(d.brokers, d.consumerConfig())
	if err != nil {
		return fmt.Errorf("replay client: %w", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("replay consumer: %w", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(d.orders)
	if err != nil {
		return fmt.Errorf("replay: partitions of %s: %w", d.orders, err)
	}
	var records []*sarama.ProducerMessage
	left := d.o.Replay
	for i, part := range parts {
		share := left / (len(parts) - i)
		hwm, err := client.GetOffset(d.orders, part, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("replay: offsets of %s/%d: %w", d.orders, part, err)
		}
		share = int(min(int64(share), hwm))
		if share == 0 {
			continue
		}
		from := hwm / 3 // an earlier offset, well inside what was already consumed
		if from+int64(share) > hwm {
			from = hwm - int64(share)
		}
		pc, err := consumer.ConsumePartition(d.orders, part, from)
		if err != nil {
			return fmt.Errorf("replay: consume %s/%d from %d: %w", d.orders, part, from, err)
		}
		for n := 0; n < share; n++ {
			select {
			case m := <-pc.Messages():
				hs := make([]sarama.RecordHeader, len(m.Headers))
				for j, h := range m.Headers {
					hs[j] = *h
				}
				records = append(records, &sarama.ProducerMessage{Topic: d.orders, Key: sarama.ByteEncoder(m.Key),
					Value: sarama.ByteEncoder(m.Value), Headers: hs})
			case <-ctx.Done():
				pc.Close()
				return ctx.Err()
			}
		}
		pc.Close()
		left -= share
	}
	p, err := d.producer()
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.SendMessages(records); err != nil {
		return fmt.Errorf("replay orders: %w", err)
	}
	d.counters.replayed.Add(int64(len(records)))
	return nil
}

// verify reads the payments topic from the start: one payment per order is
// the check; the time from order sent to payment read is the latency.
func (d *demo) verify(ctx context.Context) error {
	client, err := sarama.NewClient(d.brokers, d.consumerConfig())
	if err != nil {
		return fmt.Errorf("payments reader: %w", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("payments reader: %w", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(d.pays)
	if err != nil {
		return fmt.Errorf("payments reader: partitions of %s: %w", d.pays, err)
	}
	var wg sync.WaitGroup
	for _, part := range parts {
		pc, err := consumer.ConsumePartition(d.pays, part, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("payments reader: %s/%d: %w", d.pays, part, err)
		}
		wg.Go(func() {
			defer pc.Close()
			for {
				select {
				case m := <-pc.Messages():
					d.readPayment(m)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (d *demo) readPayment(m *sarama.ConsumerMessage) {
	now := time.Now()
	var p payment
	if err := json.Unmarshal(m.Value, &p); err != nil {
		d.log.Error("payment is not JSON", "partition", m.Partition, "offset", m.Offset, "error", err)
		return
	}
	eventID := ""
	for _, h := range m.Headers {
		if string(h.Key) == relay.EventIDHeader {
			eventID = string(h.Value)
		}
	}
	d.counters.paymentsRead.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	// The relay may publish one event twice (a crash between Kafka's ack and
	// the delete): same event id, and consumers drop it. Two event ids for
	// one order are two payments: the failure this demo checks for.
	ids := d.seen[p.OrderID]
	if ids == nil {
		ids = map[string]struct{}{}
		d.seen[p.OrderID] = ids
	}
	ids[eventID] = struct{}{}
	if len(ids) == 1 && d.latSeen(p.OrderID) {
		d.counters.paymentsUnique.Add(1)
		d.latencies = append(d.latencies, now.Sub(time.Unix(0, p.OrderSentAt)))
	}
}

// latSeen reports whether this is the order's first payment (its latency is
// measured once). d.mu is held.
func (d *demo) latSeen(orderID string) bool {
	if d.latDone[orderID] {
		return false
	}
	d.latDone[orderID] = true
	return true
}

func (d *demo) status() string {
	st := d.handler.Stats()
	backlog := d.relay.Stats().Backlog
	return fmt.Sprintf("orders sent %d/%d (+%d resent, +%d replayed) | delivered %d | duplicates skipped %d | outbox backlog %d | payments read %d",
		d.counters.sent.Load(), d.o.Orders, d.counters.resent.Load(), d.counters.replayed.Load(),
		st.Processed+st.Duplicates, st.Duplicates, backlog, d.counters.paymentsRead.Load())
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// summary prints the table and checks the two promises: one charge and one
// payment per unique order.
func (d *demo) summary(ctx context.Context, took time.Duration, cr cleanup.Report) error {
	var rows, distinct int64
	if err := d.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM demo_charges`).Scan(&rows, &distinct); err != nil {
		return fmt.Errorf("count demo_charges: %w", err)
	}
	var unpublished int64
	_ = d.pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&unpublished)
	st := d.handler.Stats()
	d.mu.Lock()
	lat := slices.Clone(d.latencies)
	multi := 0
	for _, ids := range d.seen {
		if len(ids) > 1 {
			multi++
		}
	}
	d.mu.Unlock()
	slices.Sort(lat)
	unique := int64(d.o.Orders)
	injected := d.counters.resent.Load() + d.counters.replayed.Load()

	okRows := rows == unique && distinct == unique
	okPays := d.counters.paymentsUnique.Load() == unique && multi == 0
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAILED"
	}
	w := d.a.stdout
	fmt.Fprintf(w, "\npgbox demo: orders → payments, exactly-once in effect (%s)\n\n", took.Round(10*time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "orders sent (unique)\t%d\t\n", unique)
	fmt.Fprintf(tw, "  resends injected\t%d\tsame order id, sent twice\n", d.counters.resent.Load())
	fmt.Fprintf(tw, "  replayed from an earlier offset\t%d\tre-published range of the orders topic\n", d.counters.replayed.Load())
	fmt.Fprintf(tw, "deliveries to the service\t%d\tacross %d consumer-group members\n", st.Processed+st.Duplicates, d.o.Consumers)
	fmt.Fprintf(tw, "duplicates skipped (inbox)\t%d\t%d injected; redeliveries after a rebalance add to it\n", st.Duplicates, injected)
	fmt.Fprintf(tw, "business rows (demo_charges)\t%d\t%s: %s unique orders (%d distinct order ids)\n", rows, mark(okRows), eqWord(okRows), distinct)
	fmt.Fprintf(tw, "payments published\t%d\t%s: %d of %d orders paid, %d paid more than once (%d records read; a re-sent event id is not a second payment)\n",
		d.counters.paymentsUnique.Load(), mark(okPays), d.counters.paymentsUnique.Load(), unique, multi, d.counters.paymentsRead.Load())
	fmt.Fprintf(tw, "end-to-end latency p50 / p99\t%s / %s\torder sent → payment read, over %d payments\n",
		percentile(lat, .50).Round(time.Millisecond), percentile(lat, .99).Round(time.Millisecond), len(lat))
	fmt.Fprintf(tw, "dead-lettered\t%d\t\n", st.DeadLettered)
	fmt.Fprintf(tw, "outbox rows left\t%d\t\n", unpublished)
	fmt.Fprintf(tw, "cleanup (one pass)\t%d deleted\t%s\n", cr.Deleted, cleanupNote(cr, d.orders))
	_ = tw.Flush()
	if d.o.KeepSchema {
		fmt.Fprintf(w, "\nThe demo's tables are in schema %q: try `relay status --schema %s`.\n", d.o.Schema, d.o.Schema)
	}
	if !okRows || !okPays {
		fmt.Fprintln(w, "\nFAIL")
		return fmt.Errorf("demo check failed: %d business rows, %d paid orders and %d paid more than once, for %d unique orders", rows, d.counters.paymentsUnique.Load(), multi, unique)
	}
	fmt.Fprintln(w, "\nPASS: every order charged once and paid once, despite the duplicates.")
	return nil
}

func eqWord(ok bool) string {
	if ok {
		return "equals"
	}
	return "DIFFERS FROM"
}

func cleanupNote(cr cleanup.Report, topic string) string {
	tr, ok := cr.Topic(topic)
	switch {
	case cr.Locked:
		return "another cleaner held the cleanup lease"
	case !ok:
		return "no inbox keys"
	case tr.Skipped:
		return fmt.Sprintf("%s keys kept: %s", topic, tr.Note())
	}
	return fmt.Sprintf("%s keys are kept until Kafka's log start passes their last copy (now %v), and at least the buffer (oldest is %s old)",
		topic, tr.LogStarts, durText(tr.OldestAge))
}

// progress prints a live status line: rewritten in place on a terminal,
// plain lines every few seconds otherwise.
type progress struct {
	w   io.Writer
	tty bool
	mu  sync.Mutex
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			p.tty = true
		}
	}
	return p
}

func (p *progress) line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// run updates the line from status until the returned stop is called.
func (p *progress) run(ctx context.Context, status func() string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	every := 2 * time.Second
	if p.tty {
		every = 150 * time.Millisecond
	}
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		last := 0
		for {
			select {
			case <-ctx.Done():
				s := fmt.Sprintf("[%5.1fs] %s", time.Since(start).Seconds(), status())
				p.mu.Lock()
				if p.tty {
					fmt.Fprintf(p.w, "\r%-*s\n", last, s)
				} else {
					fmt.Fprintln(p.w, s)
				}
				p.mu.Unlock()
				return
			case <-t.C:
				s := fmt.Sprintf("[%5.1fs] %s", time.Since(start).Seconds(), status())
				p.mu.Lock()
				if p.tty {
					fmt.Fprintf(p.w, "\r%-*s", last, s)
					last = len(s)
				} else {
					fmt.Fprintln(p.w, s)
				}
				p.mu.Unlock()
			}
		}
	}()
	return func() { cancel(); <-done }
}
