package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

const runDoc = `Publish the outbox to Kafka (relay) and prune old rows on a schedule (cleanup).
Serves /metrics, /healthz and /readyz on --http-addr, the operator console on --console-addr.
Stops on SIGINT/SIGTERM within --shutdown-timeout; SIGHUP re-reads a target list and is
otherwise ignored.
With --targets or --targets-query: serves every target of the list in this process,
re-reading it every --targets-refresh and on SIGHUP, within --db-conn-budget database
connections; a target whose schema is missing or behind is refused alone (logged at
ERROR, checked again at each refresh), those whose outbox holds rows checked and started
first, the others once those have caught up (5 s at most). Every --cleanup-interval each
served target is pruned under its own cleanup lease, and every --targets-refresh each
one's database figures are read for /metrics (the fleet's totals, and series of their
own for the targets --target-metrics chooses: their figures, and their detail per topic,
lane and consumer), both --targets-concurrency targets at a time. The console (--console-addr) then lists every target, the worst first, and serves
each target's pages under /t/NAME/, over the pools the relay has (no connection of its
own), its figures read in the background, --targets-concurrency targets at a time.`

// cmdRun runs the relay, cleanup on its schedule, the metrics feeder and the
// HTTP server until SIGINT/SIGTERM, then stops them all within
// --shutdown-timeout (exit 1 if that deadline passes). With a target list
// it runs cmdRunTargets instead.
func cmdRun(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("run takes no arguments (got %q)", args)
	}
	a.logSettings(slog.LevelInfo, "relay run starting")
	if a.opts.Targets.listed() {
		return cmdRunTargets(ctx, a)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkTarget(ctx, pool, targetSpec{DatabaseURL: a.opts.DatabaseURL, Schema: a.opts.Schema}, 0); err != nil {
		return err
	}

	kcfg, err := a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
	defer lk.Close()
	r, cl, exp, err := a.runParts(pool, lk)
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var httpDone <-chan error
	if a.opts.HTTPAddr != "" {
		_, httpDone, err = serveHTTP(runCtx, a.opts.HTTPAddr, a.opts.HTTPConnsPerClient, exp, &readiness{pool: pool, kafka: lk, relay: r, lanes: a.opts.Relay.Lanes}, a.log)
		if err != nil {
			return err
		}
	}
	var consoleDone <-chan error
	if a.opts.Console.Addr != "" {
		if consoleDone, err = a.serveConsole(runCtx, pool, lk, r, cl); err != nil {
			return err
		}
	}
	// Each part reports its name on stopped when it returns.
	stopped, pending := make(chan string, 5), map[string]bool{}
	start := func(name string, f func()) {
		pending[name] = true
		go func() { f(); stopped <- name }()
	}
	relayErr, httpErr := make(chan error, 1), make(chan error, 2)
	start("relay", func() { relayErr <- r.Run(runCtx) })
	if cl != nil {
		start("cleanup", func() { _ = cl.Run(runCtx) }) // a failed pass is logged and counted; the next one retries
	}
	start("metrics", func() { exp.col.Run(runCtx) })
	if httpDone != nil {
		start("http", func() {
			if err := <-httpDone; err != nil {
				httpErr <- err
			}
		})
	}
	if consoleDone != nil {
		start("console", func() {
			if err := <-consoleDone; err != nil {
				httpErr <- fmt.Errorf("console: %w", err)
			}
		})
	}
	a.log.Info("relay running", "instance", r.Instance(), "lanes", a.opts.Relay.Lanes,
		"cleanup_interval", a.opts.CleanupInterval.String(), "kafka", a.opts.Kafka.Redacted())

	// Run returns early only when it cannot go on (lane count mismatch, a
	// failure that needs an operator), or because ctx ended.
	runErr := awaitStop(ctx, a, relayErr, httpErr, "relay")
	cancel()

	if err := waitStopped(stopped, pending, a.opts.ShutdownTimeout); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	s := r.Stats()
	a.log.Info("relay stopped", "published", s.Published, "retried", s.Retried, "parked", s.Parked)
	return nil
}

// awaitStop waits until ctx ends (SIGINT/SIGTERM), the relay (what) stops
// by itself (runDone) or the HTTP server fails, and returns why it should
// stop when that is an error. ctx's end and runDone can be ready at once:
// a nil error or ctx's end is a clean stop.
func awaitStop(ctx context.Context, a *app, runDone, httpErr <-chan error, what string) error {
	var runErr error
	select {
	case err := <-runDone:
		if err != nil || ctx.Err() == nil {
			runErr = cmp.Or(err, errors.New(what+" stopped unexpectedly"))
		}
	case err := <-httpErr:
		runErr = fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	if runErr == nil && ctx.Err() != nil {
		a.log.Info("shutting down", "deadline", a.opts.ShutdownTimeout.String())
	}
	return runErr
}

// waitStopped waits until every pending part has reported on stopped, or
// fails naming the parts still running once timeout has passed.
func waitStopped(stopped <-chan string, pending map[string]bool, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(pending) > 0 {
		select {
		case name := <-stopped:
			delete(pending, name)
		case <-deadline.C:
			return fmt.Errorf("shutdown deadline %s passed with %v still stopping (rows in flight are published again by the next owner of their lane)",
				timeout, slices.Sorted(maps.Keys(pending)))
		}
	}
	return nil
}

// runParts makes the relay, the cleaner (nil with --cleanup-interval=0) and
// the metrics registry run serves.
func (a *app) runParts(pool *pgxpool.Pool, lk *lazyKafka) (*relay.Relay, *cleanup.Cleaner, *metrics, error) {
	rc, err := a.relayConfig(pool)
	if err != nil {
		return nil, nil, nil, err
	}
	r, err := relay.New(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	var cl *cleanup.Cleaner
	if a.opts.CleanupInterval > 0 {
		if cl, err = cleanup.New(a.cleanupConfig(pool, lk, false)); err != nil {
			return nil, nil, nil, err
		}
	}
	exp, err := newMetrics(pgboxprom.Config{Relay: r, Cleaner: cl, DB: pool,
		Inspect: inspect.Config{Lanes: a.opts.Relay.Lanes}, Logger: a.log.With("component", "metrics")})
	return r, cl, exp, err
}
