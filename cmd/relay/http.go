package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgbox/pgbox/internal/kafkaconf"
	"github.com/pgbox/pgbox/pgboxprom"
	"github.com/pgbox/pgbox/relay"
)

// metrics is the binary's registry: pgbox's collector plus the Go runtime's
// and the process's.
type metrics struct {
	reg *prometheus.Registry
	col *pgboxprom.Collector
}

func newMetrics(cfg pgboxprom.Config) (*metrics, error) {
	col, err := pgboxprom.New(cfg)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &metrics{reg: reg, col: col}, nil
}

// lazyKafka is a Kafka client and admin made on first use and kept (sarama
// reconnects by itself), so that the process starts while Kafka is down and
// becomes ready once it is up. Connecting happens outside the lock: a caller
// that gave up waiting (cleanup's --kafka-timeout) must not hold up Close.
type lazyKafka struct {
	brokers []string
	cfg     *sarama.Config

	mu     sync.Mutex
	closed bool
	client sarama.Client
	admin  sarama.ClusterAdmin
}

func (l *lazyKafka) connect() (sarama.Client, sarama.ClusterAdmin, error) {
	l.mu.Lock()
	c, a := l.client, l.admin
	l.mu.Unlock()
	if c != nil {
		return c, a, nil
	}
	c, err := sarama.NewClient(l.brokers, l.cfg)
	if err != nil {
		return nil, nil, kafkaconf.ConnectError(l.brokers, l.cfg, err)
	}
	if a, err = sarama.NewClusterAdminFromClient(c); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		_ = a.Close()
		return nil, nil, errors.New("kafka client closed")
	case l.client != nil: // another caller connected first
		_ = a.Close()
	default:
		l.client, l.admin = c, a
	}
	return l.client, l.admin, nil
}

// DescribeConfigs makes lazyKafka a cleanupsarama.ClusterAdmin (see cleanupcmd.go).
func (l *lazyKafka) DescribeConfigs(res []*sarama.ConfigResource, opts sarama.DescribeConfigsOptions) ([]*sarama.ConfigResourceResult, error) {
	_, a, err := l.connect()
	if err != nil {
		return nil, err
	}
	return a.DescribeConfigs(res, opts)
}

// ping refreshes the cluster metadata: Kafka is reachable if it answers.
func (l *lazyKafka) ping(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		c, _, err := l.connect()
		if err == nil {
			err = c.RefreshMetadata()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *lazyKafka) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.admin != nil {
		_ = l.admin.Close() // closes the client too
	}
	l.client, l.admin = nil, nil
}

// readiness answers /readyz: the database and Kafka answer, and the relay
// holds lanes (or is a standby because more instances run than there are
// lanes).
type readiness struct {
	pool  *pgxpool.Pool
	kafka *lazyKafka
	relay *relay.Relay
	lanes int
}

type readyReport struct {
	Ready    bool   `json:"ready"`
	Database string `json:"database"`
	Kafka    string `json:"kafka"`
	Lanes    string `json:"lanes"`
}

func (r *readiness) check(ctx context.Context) readyReport {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rep := readyReport{Ready: true, Database: "ok", Kafka: "ok", Lanes: "ok"}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.pool.Ping(ctx); err != nil {
			rep.Database, rep.Ready = "unreachable: "+err.Error(), false
		}
	})
	if r.kafka != nil {
		wg.Go(func() {
			if err := r.kafka.ping(ctx); err != nil {
				rep.Kafka = "unreachable: " + err.Error()
			}
		})
	}
	wg.Wait()
	if rep.Kafka != "ok" {
		rep.Ready = false
	}
	if r.relay != nil {
		s := r.relay.Stats()
		switch {
		case s.Lanes > 0:
			rep.Lanes = fmt.Sprintf("holding %d of %d", s.Lanes, r.lanes)
		case s.Instances > r.lanes:
			rep.Lanes = fmt.Sprintf("standby: %d instances for %d lanes", s.Instances, r.lanes)
		default:
			rep.Lanes, rep.Ready = "no lanes held yet", false
		}
	}
	return rep
}

// serveHTTP serves /metrics, /healthz and /readyz on addr until ctx ends.
// It returns once the listener is bound (or failed to bind).
func serveHTTP(ctx context.Context, addr string, m *metrics, ready *readiness, log *logger) (bound string, done <-chan error, err error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) {
		rep := ready.check(req.Context())
		w.Header().Set("Content-Type", "application/json")
		if !rep.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, usageError("PGBOX_HTTP_ADDR (--http-addr) %q: %v", addr, err)
	}
	ch := serve(ctx, ln, mux)
	log.Info("http listening", "addr", ln.Addr().String(), "paths", "/metrics /healthz /readyz")
	return ln.Addr().String(), ch, nil
}

// serve serves h on ln until ctx ends, then shuts the server down (requests
// in flight get 2s to finish). The channel receives Serve's error: nil once
// the server was shut down.
func serve(ctx context.Context, ln net.Listener, h http.Handler) <-chan error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ch := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		ch <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ch
}
