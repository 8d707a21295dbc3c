package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

// serveMetrics serves /metrics (pgbox's collector in the demo's own
// registry, as a service would) and /healthz on addr until ctx ends.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, pool *pgxpool.Pool, r *relay.Relay, ib *inbox.Inbox,
	handler *inboxsarama.Handler, log, libLog *slog.Logger) error {
	col, err := pgboxprom.New(pgboxprom.Config{Relay: r, Inbox: ib, Consumer: handler, DB: pool,
		Inspect: inspect.Config{Lanes: 4}, Logger: libLog.With("component", "metrics")})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return usageError("PGBOX_HTTP_ADDR (--http-addr) %q: %v", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() { col.Run(ctx) })
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			libLog.Error("http server", "err", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info("http listening", "addr", ln.Addr().String(), "paths", "/metrics /healthz")
	return nil
}
