package delayproxy_test

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/internal/delayproxy"
	"github.com/pgbox/pgbox/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves one echo listener until the test ends.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// A round trip through the proxy takes twice the delay; a pipeline of
// writes is not serialized by it.
func TestDelaysEachWay(t *testing.T) {
	const delay = 20 * time.Millisecond
	p, err := delayproxy.Start(echo(t), delay)
	require.NoError(t, err)
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()

	buf := make([]byte, 5)
	start := time.Now()
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	rtt := time.Since(start)
	require.Equal(t, "hello", string(buf))
	require.GreaterOrEqual(t, rtt, 2*delay)

	// Ten writes in a row come back in about one round trip, not ten.
	start = time.Now()
	for range 10 {
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
	}
	_, err = io.ReadFull(c, make([]byte, 10))
	require.NoError(t, err)
	require.Less(t, time.Since(start), 8*delay)
}

func TestPoolThroughProxy(t *testing.T) {
	db := testdb.New(t)
	t.Setenv(delayproxy.EnvDelay, "2ms")
	pool := delayproxy.Pool(t, db.Pool)
	require.NotSame(t, db.Pool, pool)
	ctx := context.Background()
	var schema string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	require.Equal(t, db.Schema, schema, "search_path kept")
	start := time.Now()
	for range 5 {
		_, err := pool.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, time.Since(start), 5*4*time.Millisecond)

	t.Setenv(delayproxy.EnvDelay, "")
	require.Same(t, db.Pool, delayproxy.Pool(t, db.Pool))
	t.Setenv(delayproxy.EnvDelay, "fast")
	_, err := delayproxy.FromEnv()
	require.ErrorContains(t, err, delayproxy.EnvDelay)
}
