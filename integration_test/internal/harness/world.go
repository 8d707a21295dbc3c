package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/pgcluster"
)

// Topics and databases of the chain.
const (
	OrdersTopic   = "orders.v1"   // orders service → payments service
	PaymentsTopic = "payments.v1" // payments service → downstream (the verifier)
	OrdersDB      = "orders"
	PaymentsDB    = "payments"
	Group         = "payments-svc"
	// dlqSuffix is the consumer adapter's default dead-letter suffix.
	dlqSuffix = ".dlq"
)

const ordersTableSQL = `CREATE TABLE orders (
	order_id   text PRIMARY KEY,
	account    text   NOT NULL,
	seq        bigint NOT NULL,
	amount     bigint NOT NULL,
	created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	UNIQUE (account, seq)
)`

// paymentsTableSQL: no unique constraint on order_id on purpose, so a second
// effect is visible instead of refused.
const paymentsTableSQL = `CREATE TABLE payments (
	id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id      text   NOT NULL,
	account       text   NOT NULL,
	seq           bigint NOT NULL,
	amount        bigint NOT NULL,
	event_id      text   NOT NULL,
	src_partition int    NOT NULL,
	src_offset    bigint NOT NULL,
	member        text   NOT NULL,
	at            timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// Options shape a World. Zero fields take the defaults named.
type Options struct {
	// Dir holds logs, the broker's data and the PostgreSQL cluster. Defaults
	// to a new temporary directory.
	Dir string
	// OrderRelays and PaymentRelays are the relay processes per database.
	// Default to 3 and 2.
	OrderRelays, PaymentRelays int
	// Consumers is the payments group's member count. Defaults to 2.
	Consumers int
	// Clients are the payments members' Kafka clients, given to the members
	// in turn: "sarama" (inbox/inboxsarama) or "franz" (inbox/inboxfranz).
	// Defaults to sarama and franz: with two members, one on each client in
	// the same consumer group, as during a service's move from one to the
	// other.
	Clients []string
	// Watermark runs the payments members in the inbox's offset-watermark
	// mode (inbox.DedupWatermarkAndKeys: the watermark for redeliveries,
	// event-id keys for the relays' duplicates). Defaults to false (keys).
	Watermark bool
	// Partitions of each topic. Defaults to 4.
	Partitions int
	// Retention is the orders topic's retention.ms, applied when the driver
	// asks the broker (ApplyRetention). Defaults to 10s.
	Retention time.Duration
	// CleanupBuffer is the cleanup passes' --cleanup-buffer. Defaults to
	// CleanupBufferDefault (1s).
	CleanupBuffer time.Duration
	// Race builds the processes with the race detector.
	Race bool
	// Bin are the executables to run (BuildBaseline's, say), which also
	// migrate the databases (their relay's `migrate up`). Defaults to
	// building them from the working tree (Build).
	Bin Binaries
	// Logf receives progress lines. Defaults to discarding them.
	Logf func(format string, args ...any)

	// BeforeServices runs once PostgreSQL, the databases and the broker
	// are up and before any service starts (to start a pgbouncer in front
	// of w.PG, say). Defaults to nothing.
	BeforeServices func(ctx context.Context, w *World) error
	// ServiceURL is the URL the services (orders, relays, payments) use
	// for database db; app names the process. Defaults to the cluster's
	// own URL with application_name set. The harness's own checks always
	// connect to the cluster directly.
	ServiceURL func(w *World, db, app string) string
	// RelayArgs are extra flags for every relay process (--no-listen...).
	RelayArgs []string
	// OrderTopics are the topics the orders service spreads its accounts
	// over and the payments group consumes. Defaults to [OrdersTopic].
	OrderTopics []string
	// TopicConfigs are topic configs of OrderTopics other than OrdersTopic
	// (OrdersTopic has retention.ms = Retention and segment.ms 1s).
	TopicConfigs map[string]map[string]string
}

func (o Options) withDefaults() Options {
	if o.OrderRelays == 0 {
		o.OrderRelays = 3
	}
	if o.PaymentRelays == 0 {
		o.PaymentRelays = 2
	}
	if o.Consumers == 0 {
		o.Consumers = 2
	}
	if len(o.Clients) == 0 {
		o.Clients = []string{"sarama", "franz"}
	}
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	if o.CleanupBuffer == 0 {
		o.CleanupBuffer = CleanupBufferDefault
	}
	if o.Retention == 0 {
		o.Retention = 10 * time.Second
	}
	if len(o.OrderTopics) == 0 {
		o.OrderTopics = []string{OrdersTopic}
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// World is the running chain.
type World struct {
	Opts    Options
	Dir     string
	Bin     Binaries
	PG      *pgcluster.Cluster
	Broker  *Proc
	Brokers []string

	Orders *Proc   // started by StartOrders
	Relays []*Proc // order relays first, then payment relays
	// RelayHTTP[i] is Relays[i]'s /metrics, /healthz and /readyz address.
	RelayHTTP []string
	Consumers []*Proc

	ordersEvents int64
}

// NewWorld builds the binaries, starts PostgreSQL and the broker, creates
// the databases, schema and topics, and starts the relays and consumers. On
// error, whatever started is stopped (its files kept).
func NewWorld(ctx context.Context, opts Options) (w *World, err error) {
	opts = opts.withDefaults()
	w = &World{Opts: opts, Dir: opts.Dir}
	if w.Dir == "" {
		if w.Dir, err = os.MkdirTemp("", "pgbox-chaos-"); err != nil {
			return nil, err
		}
		// PostgreSQL runs as another user when we are root: let it through.
		if err := os.Chmod(w.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			w.Close(true)
		}
	}()
	opts.Logf("chaos: working directory %s", w.Dir)
	w.Bin = opts.Bin
	if w.Bin == (Binaries{}) {
		if w.Bin, err = Build(ctx, filepath.Join(w.Dir, "bin"), opts.Race); err != nil {
			return w, err
		}
	}
	w.PG, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(w.Dir, "pg"),
		// fsync off: the faults crash processes, never the OS, so WAL in the
		// page cache survives; it spares a shared 2-core machine.
		Settings: []string{"fsync = off", "shared_buffers = 128MB", "max_wal_size = 1GB"}})
	if err != nil {
		return w, err
	}
	if err := w.setupDatabases(ctx); err != nil {
		return w, err
	}
	if err := w.startBroker(ctx); err != nil {
		return w, err
	}
	if err := w.createTopics(); err != nil {
		return w, err
	}
	if opts.BeforeServices != nil {
		if err := opts.BeforeServices(ctx, w); err != nil {
			return w, err
		}
	}
	return w, w.startServices()
}

func (w *World) setupDatabases(ctx context.Context) error {
	for db, table := range map[string]string{OrdersDB: ordersTableSQL, PaymentsDB: paymentsTableSQL} {
		if err := w.PG.CreateDatabase(ctx, db); err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, w.Bin.Relay, "migrate", "up", "--database-url", w.PG.URL(db)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("relay migrate up on %s: %w\n%s", db, err, out)
		}
		conn, err := pgx.Connect(ctx, w.PG.URL(db))
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, table)
		_ = conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("create business table in %s: %w", db, err)
		}
	}
	return nil
}

func (w *World) startBroker(ctx context.Context) error {
	port, err := pgcluster.FreePort()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	w.Brokers = []string{addr}
	w.Broker = &Proc{Name: "broker", Path: w.Bin.Proc, LogPath: filepath.Join(w.Dir, "broker.log"),
		Args: []string{"broker", "--data-dir", filepath.Join(w.Dir, "kafka"), "--port", strconv.Itoa(port)}}
	return w.StartBroker(ctx)
}

// StartBroker (re)starts the broker process on its port and waits until it
// accepts connections.
func (w *World) StartBroker(ctx context.Context) error {
	if err := w.Broker.Start(); err != nil {
		return err
	}
	return waitTCP(ctx, w.Brokers[0], 30*time.Second)
}

func waitTCP(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w after %v: %v", addr, errNotReady, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// KafkaConfig is a sarama config for the harness's own clients.
func KafkaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "chaos-driver"
	c.Net.DialTimeout = 2 * time.Second
	c.Net.ReadTimeout = 10 * time.Second
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Metadata.Retry.Max = 20
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}

func (w *World) createTopics() error {
	admin, err := sarama.NewClusterAdmin(w.Brokers, KafkaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	ret := strconv.FormatInt(w.Opts.Retention.Milliseconds(), 10)
	seg := "1000"
	forever := "-1"
	topics := map[string]map[string]*string{PaymentsTopic: {"retention.ms": &forever}}
	for _, t := range w.Opts.OrderTopics {
		topics[t+dlqSuffix] = map[string]*string{"retention.ms": &forever}
		if t == OrdersTopic {
			topics[t] = map[string]*string{"retention.ms": &ret, "segment.ms": &seg}
			continue
		}
		topics[t] = map[string]*string{}
		for k, v := range w.Opts.TopicConfigs[t] {
			topics[t][k] = &v
		}
	}
	for name, cfg := range topics {
		d := &sarama.TopicDetail{NumPartitions: int32(w.Opts.Partitions), ReplicationFactor: 1, ConfigEntries: cfg}
		if err := admin.CreateTopic(name, d, false); err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
	}
	return nil
}

// dsn is db's URL with application_name set, so pg_stat_activity tells
// whose connection a backend is.
func (w *World) dsn(db, app string) string {
	if w.Opts.ServiceURL != nil {
		return w.Opts.ServiceURL(w, db, app)
	}
	u, _ := url.Parse(w.PG.URL(db))
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

func (w *World) startServices() error {
	for i := range w.Opts.OrderRelays + w.Opts.PaymentRelays {
		db, name := OrdersDB, fmt.Sprintf("relay-orders-%d", i+1)
		if i >= w.Opts.OrderRelays {
			db, name = PaymentsDB, fmt.Sprintf("relay-payments-%d", i-w.Opts.OrderRelays+1)
		}
		port, err := pgcluster.FreePort()
		if err != nil {
			return err
		}
		p := &Proc{Name: name, Path: w.Bin.Relay, LogPath: filepath.Join(w.Dir, name+".log"), Args: append(relayArgs(w.dsn(db, name), w.Brokers[0], name, port), w.Opts.RelayArgs...),
			// The sweep's look every 5 s instead of every minute, so a row
			// the floor let pass is found (and counted: Verdict.BelowFloor)
			// within the run. An environment variable: the upgrade test's
			// older relays ignore it (they have no such flag).
			Env: []string{"PGBOX_SWEEP_INTERVAL=5s"}}
		w.Relays = append(w.Relays, p)
		w.RelayHTTP = append(w.RelayHTTP, "127.0.0.1:"+strconv.Itoa(port))
	}
	dedup := "keys"
	if w.Opts.Watermark {
		dedup = "watermark"
	}
	for i := range w.Opts.Consumers {
		client := w.Opts.Clients[i%len(w.Opts.Clients)]
		name := fmt.Sprintf("payments-%d-%s", i+1, client) // verify counts effects per client by this suffix
		w.Consumers = append(w.Consumers, &Proc{Name: name, Path: w.Bin.Proc, LogPath: filepath.Join(w.Dir, name+".log"),
			Args: []string{"payments", "--db", w.dsn(PaymentsDB, name), "--brokers", w.Brokers[0], "--group", Group,
				"--topic", strings.Join(w.Opts.OrderTopics, ","), "--out-topic", PaymentsTopic, "--member", name, "--dedup", dedup,
				"--client", client}})
	}
	for _, p := range append(append([]*Proc{}, w.Relays...), w.Consumers...) {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

// relayArgs runs the relay with short leases (fast failover after a kill)
// and no cleanup schedule (the driver runs cleanup as a fault).
func relayArgs(dsn, broker, name string, httpPort int) []string {
	return []string{"run", "--database-url", dsn, "--kafka-brokers", broker, "--instance", name,
		"--lanes", "8", "--heartbeat-interval", "250ms", "--lease-ttl", "1500ms",
		"--cleanup-interval", "0s", "--http-addr", "127.0.0.1:" + strconv.Itoa(httpPort),
		"--kafka-timeout", "3s", "--shutdown-timeout", "5s"}
}

// StartOrders starts the orders service: events orders in total at rate per
// second.
func (w *World) StartOrders(events int64, rate float64, seed uint64) error {
	w.ordersEvents = events
	w.Orders = &Proc{Name: "orders", Path: w.Bin.Proc, LogPath: filepath.Join(w.Dir, "orders.log"),
		Args: []string{"orders", "--db", w.dsn(OrdersDB, "orders"), "--events", strconv.FormatInt(events, 10),
			"--rate", strconv.FormatFloat(rate, 'f', 2, 64), "--topic", strings.Join(w.Opts.OrderTopics, ","), "--seed", strconv.FormatUint(seed, 10)}}
	return w.Orders.Start()
}

// Procs lists every process (broker included).
func (w *World) Procs() []*Proc {
	ps := []*Proc{w.Broker}
	if w.Orders != nil {
		ps = append(ps, w.Orders)
	}
	ps = append(ps, w.Relays...)
	return append(ps, w.Consumers...)
}

// LogPaths lists every process's log, PostgreSQL's included.
func (w *World) LogPaths() []string {
	var out []string
	for _, p := range w.Procs() {
		if p != nil {
			out = append(out, p.LogPath)
		}
	}
	if w.PG != nil {
		out = append(out, w.PG.Log)
	}
	return out
}

// Close stops every process and PostgreSQL; with keep false it deletes the
// working directory too.
func (w *World) Close(keep bool) {
	for _, p := range w.Procs() {
		if p != nil {
			_ = p.Term(5 * time.Second)
		}
	}
	if w.PG != nil {
		_ = w.PG.Destroy(true)
	}
	if !keep && w.Dir != "" {
		_ = os.RemoveAll(w.Dir)
	}
}

// RunRelay runs the relay binary once with args (cleanup, status) and
// returns its combined output.
func (w *World) RunRelay(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, w.Bin.Relay, args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// tailLines returns up to n last lines of a file.
func tailLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}
