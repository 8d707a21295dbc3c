package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// readyChecker answers /readyz: whether the process is ready, and the
// report (JSON) saying why.
type readyChecker interface {
	report(ctx context.Context) (ready bool, body any)
}

func (r *readiness) report(ctx context.Context) (bool, any) {
	rep := r.check(ctx)
	return rep.Ready, rep
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

// serveHTTP serves /metrics, /healthz and /readyz on addr until ctx ends,
// at most perClient connections per client address. It returns once the
// listener is bound (or failed to bind).
func serveHTTP(ctx context.Context, addr string, perClient int, m *metrics, ready readyChecker, log *logger) (bound string, done <-chan error, err error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) {
		ok, rep := ready.report(req.Context())
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(rep)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, usageError("PGBOX_HTTP_ADDR (--http-addr) %q: %v", addr, err)
	}
	ch := serve(ctx, ln, perClient, mux)
	log.Info("http listening", "addr", ln.Addr().String(), "paths", "/metrics /healthz /readyz")
	return ln.Addr().String(), ch, nil
}

// The HTTP servers' (/metrics and the console) bounds on a connection: a
// client that sends slowly, or not at all, holds a connection (a file
// descriptor, a goroutine) only this long, so slow clients cannot exhaust
// the process's descriptors and take /healthz down with them.
const (
	// httpReadHeaderTimeout bounds reading a request's headers.
	httpReadHeaderTimeout = 5 * time.Second
	// httpReadTimeout bounds reading a whole request, body included (a
	// console form is at most about 84 KB).
	httpReadTimeout = 10 * time.Second
	// httpWriteTimeout bounds a response from the end of its request's
	// headers: a console page's database work stops at its 10 s
	// QueryTimeout, /readyz's checks at 3 s.
	httpWriteTimeout = 30 * time.Second
	// httpIdleTimeout is how long a kept-alive connection may wait for its
	// next request.
	httpIdleTimeout = 30 * time.Second
)

// serve serves h on ln until ctx ends, at most perClient connections per
// client address (perClientListener), then shuts the server down
// (requests in flight get 2s to finish). The channel receives Serve's
// error: nil once the server was shut down.
func serve(ctx context.Context, ln net.Listener, perClient int, h http.Handler) <-chan error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout}
	ch := make(chan error, 1)
	go func() {
		err := srv.Serve(&perClientListener{Listener: ln, max: perClient, open: map[string]int{}})
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

// perClientListener admits at most max open connections per client
// address; a connection past it is answered 503 and closed at once. The
// timeouts free a slow client's connections within seconds; this bound
// keeps one client from holding hundreds meanwhile. Each listener counts
// its own: a client crowding the console leaves /healthz alone.
type perClientListener struct {
	net.Listener
	max int

	mu   sync.Mutex
	open map[string]int // by client address
}

// tooMany answers a connection past the bound.
const tooMany = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 39\r\n\r\ntoo many connections from this address\n"

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientAddr(c.RemoteAddr())
		l.mu.Lock()
		admit := l.open[client] < l.max
		if admit {
			l.open[client]++
		}
		l.mu.Unlock()
		if admit {
			return &clientConn{Conn: c, release: sync.OnceFunc(func() { l.release(client) })}, nil
		}
		go func() {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = io.WriteString(c, tooMany)
			_ = c.Close()
		}()
	}
}

func (l *perClientListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[client]--; l.open[client] <= 0 {
		delete(l.open, client)
	}
}

// clientAddr is the address a connection comes from, without its port.
func clientAddr(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap().String()
	}
	return a.String()
}

// clientConn is an admitted connection; closing it frees its place.
type clientConn struct {
	net.Conn
	release func()
}

func (c *clientConn) Close() error {
	c.release()
	return c.Conn.Close()
}
