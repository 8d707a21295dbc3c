package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

const checkSchemaSQL = `SELECT 1 FROM pgbox_outbox, pgbox_relay_lanes, pgbox_inbox LIMIT 0`

// cmdRun runs the relay, cleanup on its schedule, the metrics feeder and the
// HTTP server until SIGINT/SIGTERM, then stops them all within
// --shutdown-timeout (exit 1 if that deadline passes).
func cmdRun(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("run takes no arguments (got %q)", args)
	}
	a.logSettings(slog.LevelInfo, "pgbox-relay run starting")
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, checkSchemaSQL); err != nil {
		return schemaHint(fmt.Errorf("check pgbox tables: %w", err))
	}

	rc, err := a.relayConfig(pool)
	if err != nil {
		return err
	}
	r, err := relay.New(rc)
	if err != nil {
		return err
	}
	kcfg, err := a.opts.Kafka.Sarama()
	if err != nil {
		return err
	}
	lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
	defer lk.Close()

	var cl *cleanup.Cleaner
	if a.opts.CleanupInterval > 0 {
		cl, err = cleanup.New(a.cleanupConfig(pool, lk, false))
		if err != nil {
			return err
		}
	}
	exp, err := newMetrics(pgboxprom.Config{Relay: r, Cleaner: cl, DB: pool,
		Inspect: inspect.Options{Lanes: a.opts.Relay.Lanes}, Logger: a.log.With("component", "metrics")})
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var httpDone <-chan error
	if a.opts.HTTPAddr != "" {
		_, httpDone, err = serveHTTP(runCtx, a.opts.HTTPAddr, exp, &readiness{pool: pool, kafka: lk, relay: r, lanes: a.opts.Relay.Lanes}, a.log)
		if err != nil {
			return err
		}
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(runCtx) }()
	cleanDone := make(chan error, 1)
	if cl != nil {
		go func() { cleanDone <- cl.Run(runCtx) }()
	} else {
		cleanDone <- nil
	}
	pollDone := make(chan struct{})
	go func() { exp.col.Run(runCtx); close(pollDone) }()
	a.log.Info("relay running", "instance", r.Instance(), "lanes", a.opts.Relay.Lanes,
		"cleanup_interval", a.opts.CleanupInterval.String(), "kafka", a.opts.Kafka.Redacted())

	var runErr error
	select {
	case err := <-relayDone:
		// Run returns early only when it cannot start (lane count mismatch).
		if err == nil {
			err = errors.New("relay stopped unexpectedly")
		}
		runErr = err
		relayDone <- nil
	case err := <-httpDone:
		runErr = fmt.Errorf("http server: %w", err)
		httpDone = nil
	case <-ctx.Done():
		a.log.Info("shutting down", "deadline", a.opts.ShutdownTimeout.String())
	}
	cancel()

	deadline := time.NewTimer(a.opts.ShutdownTimeout)
	defer deadline.Stop()
	pending := map[string]bool{"relay": true, "cleanup": true, "metrics": true}
	if httpDone != nil {
		pending["http"] = true
	}
	for len(pending) > 0 {
		select {
		case <-relayDone:
			delete(pending, "relay")
		case <-cleanDone:
			delete(pending, "cleanup")
		case <-pollDone:
			delete(pending, "metrics")
			pollDone = nil
		case <-httpDone:
			delete(pending, "http")
			httpDone = nil
		case <-deadline.C:
			names := make([]string, 0, len(pending))
			for n := range pending {
				names = append(names, n)
			}
			return fmt.Errorf("shutdown deadline %s passed with %v still stopping (rows in flight are published again by the next owner of their lane)", a.opts.ShutdownTimeout, names)
		}
	}
	if runErr != nil {
		return runErr
	}
	s := r.Stats()
	a.log.Info("relay stopped", "published", s.Published, "retried", s.Retried, "parked", s.Parked)
	return nil
}
