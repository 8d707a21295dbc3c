// Package delayproxy is a TCP proxy on loopback that adds a fixed delay to
// every byte each way, so that benchmarks on one machine pay the round trips
// a service pays to a database on another host (0.3–1 ms), which is where
// saving round trips shows. It delays without throttling: bytes are read as
// they come and written once their delay has passed, so a pipeline of
// statements keeps flowing.
//
// Benchmarks call Pool, which does nothing unless PGBOX_BENCH_DELAY (a Go
// duration, e.g. "500us") is set: `make bench-remote` sets it.
package delayproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDelay names the environment variable Pool and FromEnv read.
const EnvDelay = "PGBOX_BENCH_DELAY"

// Proxy forwards connections on Addr to a target, delaying each direction.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards to target (host:port).
func Start(target string, delay time.Duration) (*Proxy, error) {
	if delay < 0 {
		return nil, fmt.Errorf("delayproxy: negative delay %v", delay)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delayproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Delay is the delay added each way.
func (p *Proxy) Delay() time.Duration { return p.delay }

// Close stops listening, closes every forwarded connection and waits for
// the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			return
		}
		p.wg.Add(1)
		go p.serve(in)
	}
}

func (p *Proxy) serve(in net.Conn) {
	defer p.wg.Done()
	out, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(out) {
		_ = in.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(out, in) }()
	go func() { defer wg.Done(); p.pump(in, out) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}

type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst, each chunk written delay after it was read. When
// either side ends, both connections are closed.
func (p *Proxy) pump(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q { // drain so the reader never blocks
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.delay)}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			break
		}
	}
	close(q)
	<-done
}

// FromEnv returns the delay EnvDelay asks for (0 when unset).
func FromEnv() (time.Duration, error) {
	v := os.Getenv(EnvDelay)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("delayproxy: %s=%q is not a non-negative Go duration (e.g. 500us)", EnvDelay, v)
	}
	return d, nil
}

// Pool returns pool itself when EnvDelay is unset, else a new pool with the
// same configuration (search_path included) connecting through a Proxy that
// delays each direction by EnvDelay. Both are closed when tb ends.
func Pool(tb testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	tb.Helper()
	d, err := FromEnv()
	if err != nil {
		tb.Fatal(err)
	}
	if d == 0 {
		return pool
	}
	cfg := pool.Config()
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	p, err := Start(target, d)
	if err != nil {
		tb.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.Fallbacks = nil
	delayed, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		_ = p.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		delayed.Close()
		_ = p.Close()
	})
	return delayed
}
