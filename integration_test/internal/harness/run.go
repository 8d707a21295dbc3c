package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// Config is one fault run.
type Config struct {
	// Seed drives the fault schedule, the gaps and every random pick; the
	// same seed replays the same schedule.
	Seed uint64
	// Events is how many orders the orders service commits.
	Events int64
	// PerKind is how many times each fault kind is injected.
	PerKind int
	// Gap is the mean pause between two faults (uniform in [Gap/2, 3Gap/2]).
	Gap time.Duration
	// Rate is orders per second. Defaults to Events spread over the
	// schedule's expected length.
	Rate float64
	// RecoveryLimit fails the run when progress has not resumed this long
	// after a fault ended. Defaults to 2 minutes.
	RecoveryLimit time.Duration
	// DrainTimeout bounds the wait, after the orders service finished (or
	// last made progress), for every order to have its effect and downstream
	// record. Defaults to 10 minutes.
	DrainTimeout time.Duration
}

// FaultRecord is one injected fault.
type FaultRecord struct {
	Kind     Fault
	At       time.Duration // since the run started
	Detail   string
	Recovery time.Duration // fault end → effects and downstream records advancing again
}

// Report is a run's outcome.
type Report struct {
	Seed         uint64
	Config       Config
	Took         time.Duration
	Verdict      Verdict
	Faults       []FaultRecord
	InboxDeleted int64 // inbox keys the cleanup faults deleted
	Redelivered  int64 // records redelivered by the rewinds
	// Exits lists processes that exited without being killed (restarted
	// by the driver, as a supervisor would).
	Exits      []string
	Violations []string // found during the run (a broker restart losing records)
	Stalls     []string // faults after which progress did not resume in time
	Logs       []string
	// Err is why the run stopped before its verdict, if it did.
	Err error
}

// OK reports whether every guarantee held and progress always resumed.
func (r *Report) OK() bool {
	return r.Err == nil && r.Verdict.OK() && len(r.Violations) == 0 && len(r.Stalls) == 0
}

func (c Config) withDefaults() Config {
	if c.PerKind == 0 {
		c.PerKind = 2
	}
	if c.Gap == 0 {
		c.Gap = 4 * time.Second
	}
	if c.Rate == 0 {
		// Faults take a few seconds each on top of the gap.
		span := time.Duration(c.PerKind*len(AllFaults)) * (c.Gap + 5*time.Second)
		c.Rate = float64(c.Events) / span.Seconds()
	}
	if c.RecoveryLimit == 0 {
		c.RecoveryLimit = 2 * time.Minute
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Minute
	}
	return c
}

// Schedule is the seeded order of faults: every kind PerKind times, shuffled.
func Schedule(seed uint64, perKind int) []Fault {
	var s []Fault
	for range perKind {
		s = append(s, AllFaults...)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}

// Run starts the orders service, injects the schedule's faults while orders
// flow, waits for the chain to drain and verifies it.
func (w *World) Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	rep := &Report{Seed: cfg.Seed, Config: cfg}
	start := time.Now()
	err := w.run(ctx, cfg, rep)
	rep.Took, rep.Err = time.Since(start), err
	rep.Logs = w.LogPaths()
	return rep, err
}

func (w *World) run(ctx context.Context, cfg Config, rep *Report) error {
	start := time.Now()
	w.Opts.Logf("chaos: seed %d, %d events at %.0f/s, %d faults (%d per kind)", cfg.Seed, cfg.Events, cfg.Rate, cfg.PerKind*len(AllFaults), cfg.PerKind)
	if err := w.StartOrders(cfg.Events, cfg.Rate, cfg.Seed); err != nil {
		return err
	}
	in := &injector{w: w, rng: rand.New(rand.NewPCG(cfg.Seed, 2))}
	mon := newMonitor(w)
	defer mon.close()
	sched := Schedule(cfg.Seed, cfg.PerKind)
	for i, f := range sched {
		gap := cfg.Gap/2 + time.Duration(in.rng.Int64N(int64(cfg.Gap)))
		if err := w.supervise(ctx, gap, rep); err != nil {
			return err
		}
		// Spread the faults over the orders, however fast this machine
		// turns out to be: fault i waits for order i/(n+1) of the run.
		if err := w.waitOrders(ctx, cfg.Events*int64(i+1)/int64(len(sched)+1), rep); err != nil {
			return err
		}
		at := time.Since(start)
		detail, err := in.inject(ctx, f)
		if err != nil {
			return fmt.Errorf("fault %d (%s): %w", i+1, f, err)
		}
		rec := FaultRecord{Kind: f, At: at, Detail: detail}
		rec.Recovery, err = mon.waitProgress(ctx, cfg.RecoveryLimit)
		if err != nil {
			rep.Stalls = append(rep.Stalls, fmt.Sprintf("after fault %d (%s at %v): %v", i+1, f, at.Round(time.Second), err))
		}
		w.Opts.Logf("chaos: [%s] fault %d/%d %s: %s; progress resumed after %v", time.Since(start).Round(time.Second), i+1, cfg.PerKind*len(AllFaults), f, detail, rec.Recovery.Round(time.Millisecond))
		rep.Faults = append(rep.Faults, rec)
	}
	rep.Violations, rep.InboxDeleted, rep.Redelivered = in.violations, in.inboxDeleted, in.redelivered
	if cfg.PerKind > 0 && in.inboxDeleted == 0 {
		rep.Violations = append(rep.Violations, "VACUOUS CLEANUP: the cleanup faults deleted no inbox key, so the rewinds proved nothing (see cleanup.log)")
	}
	if err := w.drain(ctx, cfg.Events, cfg.DrainTimeout, rep); err != nil {
		// The verdict still tells what is missing.
		rep.Verdict, _ = w.Verify(ctx)
		return err
	}
	v, err := w.Verify(ctx)
	rep.Verdict = v
	return err
}

// supervise waits d, restarting (and recording) any relay or consumer that
// exited on its own, as systemd or Kubernetes would.
func (w *World) supervise(ctx context.Context, d time.Duration, rep *Report) error {
	end := time.Now().Add(d)
	for {
		for _, p := range append(append([]*Proc{w.Broker}, w.Relays...), w.Consumers...) {
			if !p.Running() {
				rep.Exits = append(rep.Exits, fmt.Sprintf("%s exited by itself (%v); last log lines:\n    %s", p.Name, p.ExitErr(), strings.Join(tailLines(p.LogPath, 3), "\n    ")))
				if p == w.Broker {
					if err := w.StartBroker(ctx); err != nil {
						return err
					}
				} else if err := p.Start(); err != nil {
					return err
				}
			}
		}
		if time.Now().After(end) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(200*time.Millisecond, time.Until(end)+time.Millisecond)):
		}
	}
}

// waitOrders waits until n orders are committed (or the orders service
// has exited), supervising the processes.
func (w *World) waitOrders(ctx context.Context, n int64, rep *Report) error {
	for {
		c, _ := w.counts(ctx) // orders is read first: a Kafka error leaves it set
		if c.orders >= n || !w.Orders.Running() {
			return nil
		}
		if err := w.supervise(ctx, time.Second, rep); err != nil {
			return err
		}
	}
}

// WaitDrained waits up to timeout for the orders service to have committed
// events orders and exited, and every order to have its effect and its
// downstream record. It restarts processes that exit on their own and
// returns what it restarted.
func (w *World) WaitDrained(ctx context.Context, events int64, timeout time.Duration) ([]string, error) {
	var rep Report
	err := w.drain(ctx, events, timeout, &rep)
	return rep.Exits, err
}

func (w *World) drain(ctx context.Context, events int64, timeout time.Duration, rep *Report) error {
	// The timeout runs from the orders service's exit (a slow machine
	// writes slowly) or from its last progress, whichever is later.
	deadline := time.Now().Add(timeout)
	var lastOrders int64
	for {
		if err := w.supervise(ctx, time.Second, rep); err != nil {
			return err
		}
		c, err := w.counts(ctx)
		ordersDone := !w.Orders.Running()
		if err == nil && ordersDone && c.orders >= events && c.effects >= c.orders && c.downstream >= c.effects {
			return nil
		}
		if !ordersDone && c.orders > lastOrders {
			lastOrders = c.orders
			deadline = time.Now().Add(timeout)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not drained after %v: orders service done=%t (%v), %+v (err %v)", timeout, ordersDone, w.Orders.ExitErr(), c, err)
		}
	}
}

type counts struct{ orders, effects, downstream int64 }

func (w *World) counts(ctx context.Context) (counts, error) {
	var c counts
	for db, dst := range map[string]*int64{OrdersDB: &c.orders, PaymentsDB: &c.effects} {
		conn, err := pgx.Connect(ctx, w.PG.URL(db))
		if err != nil {
			return c, err
		}
		err = conn.QueryRow(ctx, `SELECT count(*) FROM `+db).Scan(dst)
		_ = conn.Close(ctx)
		if err != nil {
			return c, err
		}
	}
	hwm, err := highWaterMarks(w.Brokers, []string{PaymentsTopic})
	for _, n := range hwm {
		c.downstream += n
	}
	return c, err
}

// monitor samples progress: the newest effect and the downstream topic's
// total high-water mark.
type monitor struct {
	w      *World
	conn   *pgx.Conn
	client sarama.Client
}

func newMonitor(w *World) *monitor { return &monitor{w: w} }

func (m *monitor) close() {
	if m.conn != nil {
		_ = m.conn.Close(context.Background())
	}
	if m.client != nil {
		_ = m.client.Close()
	}
}

// sample returns (effects, downstream records); -1 where unreadable.
func (m *monitor) sample(ctx context.Context) (int64, int64) {
	eff, down := int64(-1), int64(-1)
	if m.conn == nil || m.conn.IsClosed() {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m.conn, _ = pgx.Connect(cctx, m.w.PG.URL(PaymentsDB))
		cancel()
	}
	if m.conn != nil {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := m.conn.QueryRow(qctx, `SELECT coalesce(max(id), 0) FROM payments`).Scan(&eff); err != nil {
			eff = -1
			_ = m.conn.Close(ctx)
			m.conn = nil
		}
		cancel()
	}
	if m.client == nil {
		m.client, _ = sarama.NewClient(m.w.Brokers, KafkaConfig())
	}
	if m.client != nil {
		var sum int64
		for p := range int32(m.w.Opts.Partitions) {
			hwm, err := m.client.GetOffset(PaymentsTopic, p, sarama.OffsetNewest)
			if err != nil {
				_ = m.client.Close()
				m.client = nil
				return eff, -1
			}
			sum += hwm
		}
		down = sum
	}
	return eff, down
}

// waitProgress returns how long it took from now until both new effects
// and new downstream records appeared (or the chain was idle: every order
// handled).
func (m *monitor) waitProgress(ctx context.Context, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	eff0, down0 := m.sample(ctx)
	effOK, downOK := false, false
	for {
		eff, down := m.sample(ctx)
		effOK = effOK || (eff0 >= 0 && eff > eff0)
		downOK = downOK || (down0 >= 0 && down > down0)
		if eff0 < 0 && eff >= 0 {
			eff0 = eff
		}
		if down0 < 0 && down >= 0 {
			down0 = down
		}
		if effOK && downOK {
			return time.Since(start), nil
		}
		if !m.w.Orders.Running() {
			if c, err := m.w.counts(ctx); err == nil && c.effects >= c.orders && c.downstream >= c.effects {
				return time.Since(start), nil
			}
		}
		if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("no progress within %v (effects advancing: %t, downstream advancing: %t)", limit, effOK, downOK)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func sortedOffsets(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s@%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
