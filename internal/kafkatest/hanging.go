package kafkatest

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// HangingBroker listens on 127.0.0.1, accepts connections and never answers
// (a broker that hangs). It returns its address and the number of
// connections accepted so far; listener and connections close when the test
// ends.
func HangingBroker(t testing.TB) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return len(conns) }
}
