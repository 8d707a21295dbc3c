// Command demo runs pgbox's orders→payments flow end to end (`make demo`): a
// producer with injected duplicates, a consumer-group service using the inbox
// and the outbox, the relay, one cleanup pass; then it checks and prints a
// summary. It uses an embedded Kafka broker (kfake) unless KAFKA_BROKERS is
// set, and its own schema (reset at start).
//
// service.go is the payment service, pgbox's three calls on one screen;
// wiring.go connects its parts to Kafka; internal/harness produces the
// orders (and the duplicates), reads the payments back and checks them.
//
// Every setting is a flag and an environment variable (the flag wins); `demo
// --help` lists them. Exit codes: 0 the check passed, 1 it failed or the demo
// could not run, 2 bad flags or environment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/examples/demo/internal/harness"
	"github.com/pgbox/pgbox/internal/dbconf"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := realMain(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// app is what the demo runs with.
type app struct {
	opts   *options
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

var errUsage = errors.New("usage error")

func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

func realMain(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	opts, err := parseOptions(args, stdout, getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", strings.TrimPrefix(err.Error(), "usage error: "))
		return 2
	}
	a := &app{opts: opts, stdout: stdout, stderr: stderr, log: newLogger(stderr, opts.LogFormat, opts.LogLevel)}
	if err := cmdDemo(ctx, a); err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			fmt.Fprintln(stderr, "demo: interrupted")
			return 1
		}
		a.log.Error("demo failed", "err", err)
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	return 0
}

func cmdDemo(ctx context.Context, a *app) error {
	d := a.opts.Demo
	ctx, cancel := context.WithTimeout(ctx, d.Duration)
	defer cancel()
	err := a.run(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("demo did not finish within PGBOX_DEMO_DURATION (--duration) %s: %w (raise it, or lower --orders)", d.Duration, err)
	}
	return err
}

// run is one demo: Kafka and the schema, the service, the orders, the check.
func (a *app) run(ctx context.Context) error {
	start := time.Now()
	cfg := a.opts.Demo
	prog := harness.NewProgress(a.stderr)
	// Library logs would tear the progress line: warnings and up only, unless
	// a level was asked for.
	libLog := a.log
	if !a.opts.logLevelSet {
		libLog = newLogger(a.stderr, a.opts.LogFormat, "warn")
	}
	kcfg, err := a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	kdesc := a.opts.Kafka.Redacted()
	h := harness.New(cfg, kcfg, kdesc, libLog, a.stdout)

	where, stopKafka, err := h.StartKafka(a.opts.Kafka.Brokers)
	if err != nil {
		return err
	}
	defer stopKafka()
	prog.Line("pgbox demo: %d orders (+%d%% resends, %d replayed) → %s, schema %q, inbox key: %s", cfg.Orders, cfg.DupPercent, cfg.Replay, where, cfg.Schema, cfg.DedupKey)

	pool, err := a.setupDB(ctx, h)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !cfg.KeepSchema {
		defer a.dropSchema(h)
	}

	// The service: the consumer (inbox + adapter) and the relay.
	svc := paymentService{paymentsTopic: h.Payments}
	ib, handler, err := svc.newConsumer(pool, cfg.DedupKey, libLog)
	if err != nil {
		return err
	}
	rl, err := newRelay(pool, h.Brokers, kcfg, libLog)
	if err != nil {
		return err
	}
	h.Watch(harness.Service{Pool: pool, Consumer: handler, Relay: rl})

	svcCtx, stopSvc := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// On every return: stop the service and wait for it before the pool and
	// the broker close.
	defer func() { stopSvc(); wg.Wait() }()
	errs := make(chan error, 8)
	wg.Go(func() {
		if err := rl.Run(svcCtx); err != nil {
			errs <- fmt.Errorf("relay: %w", err)
		}
	})
	for i := range cfg.Consumers {
		wg.Go(func() {
			err := consume(svcCtx, h.Brokers, h.Group, h.Orders, h.ConsumerConfig(), h.Member(handler, i), libLog.With("member", i))
			if err != nil && svcCtx.Err() == nil {
				errs <- fmt.Errorf("consumer %d: %w", i, err)
			}
		})
	}
	wg.Go(func() {
		if err := h.Verify(svcCtx); err != nil && svcCtx.Err() == nil {
			errs <- err
		}
	})
	if a.opts.HTTPAddr != "" {
		if err := serveMetrics(svcCtx, &wg, a.opts.HTTPAddr, pool, rl, ib, handler, a.log, libLog); err != nil {
			return err
		}
	}
	stopProgress := prog.Run(ctx, h.Status)

	// The producer: orders, resends, then a replay from an earlier offset;
	// then wait until every delivery is handled and every payment read back.
	h.WaitSettled(ctx)
	err = h.Produce(ctx)
	if err == nil {
		err = h.Replay(ctx)
	}
	if err == nil {
		err = h.WaitHandled(ctx, errs)
	}
	stopProgress()
	if err != nil {
		return err
	}
	took := time.Since(start)

	cleanRep, cleanErr := cleanupOnce(ctx, pool, h.Brokers, kcfg, kdesc, libLog)
	stopSvc()
	wg.Wait()
	if cleanErr != nil {
		return cleanErr
	}
	return h.Summary(ctx, took, cleanRep)
}

// setupDB resets the demo schema and returns a pool on it, migrated.
func (a *app) setupDB(ctx context.Context, h *harness.Harness) (*pgxpool.Pool, error) {
	admin, err := a.openPool(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := h.ResetSchema(ctx, admin); err != nil {
		return nil, err
	}
	d := a.opts.Demo
	cfg, err := poolConfig(a.opts.DatabaseURL, d.Schema, max(a.opts.DBMaxConns, d.Consumers*d.Partitions+6))
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %s", dbconf.RedactErr(err, a.opts.DatabaseURL))
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func (a *app) dropSchema(h *harness.Harness) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := a.openPool(ctx)
	if err != nil {
		return
	}
	defer admin.Close()
	h.DropSchema(ctx, admin)
}

// poolConfig parses DATABASE_URL; schema becomes the connections' search_path.
func poolConfig(databaseURL, schema string, maxConns int) (*pgxpool.Config, error) {
	cfg, err := dbconf.Config(databaseURL, schema, maxConns, "pgbox-demo")
	if err != nil {
		return nil, usageError("invalid DATABASE_URL (--database-url): %v", err)
	}
	return cfg, nil
}

// openPool connects to DATABASE_URL (its own search_path) and checks it answers.
func (a *app) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(a.opts.DatabaseURL, "", 2)
	if err != nil {
		return nil, err
	}
	return dbconf.Open(ctx, cfg, a.opts.DatabaseURL)
}
