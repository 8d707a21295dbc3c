package main

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/pgboxprom"
)

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

// sqlDB wraps a pool as a *sql.DB for goose.
func sqlDB(pool *pgxpool.Pool) *sql.DB { return stdlib.OpenDBFromPool(pool) }

// serveMetrics serves /metrics (pgbox's collector in the demo's own
// registry, as a service would) and /healthz on --http-addr until ctx ends.
func (d *demo) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	col, err := pgboxprom.New(pgboxprom.Config{Relay: d.relay, Inbox: d.ib, Consumer: d.handler, DB: d.pool,
		Inspect: inspect.Config{Lanes: 4}, Logger: d.log.With("component", "metrics")})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ln, err := net.Listen("tcp", d.a.opts.HTTPAddr)
	if err != nil {
		return usageError("PGBOX_HTTP_ADDR (--http-addr) %q: %v", d.a.opts.HTTPAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() { col.Run(ctx) })
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("http server", "err", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	d.a.log.Info("http listening", "addr", ln.Addr().String(), "paths", "/metrics /healthz")
	return nil
}
