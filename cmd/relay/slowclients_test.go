package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

func init() {
	flagChecks["http-conns-per-client"] = flagCheck{check: checkHTTPConnsPerClient, bad: "0"}
}

// slowPost is a request that announces a body and never sends it: the
// server answers (401 from the console) and then waits for the body.
const slowPost = "POST /parked/retry HTTP/1.1\r\nHost: relay\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"

// dialSlow opens n connections to addr from 127.0.0.1, each sending
// slowPost (none, if idle) and nothing more.
func dialSlow(t *testing.T, addr string, n int, idle bool) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		if !idle {
			_, err = io.WriteString(c, slowPost)
			require.NoError(t, err)
		}
		conns[i] = c
	}
	return conns
}

// otherClient is an HTTP client on another address (127.0.0.2) than the
// slow connections'.
func otherClient() *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

func getFrom(t *testing.T, cl *http.Client, url string) int {
	t.Helper()
	resp, err := cl.Get(url)
	require.NoError(t, err, "GET %s", url)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// closedWithin reads each connection until the server closes it and
// returns how long each took (0: still open after wait).
func closedWithin(conns []net.Conn, wait time.Duration) []time.Duration {
	start := time.Now()
	took := make([]time.Duration, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(start.Add(wait))
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
				took[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	return took
}

// Issue 33 item 8: hundreds of slow connections from one client (a POST
// announcing a body it never sends, as an unauthenticated attacker can)
// neither exhaust the relay's file descriptors nor take /healthz and the
// console down: past --http-conns-per-client a client's connections are
// answered 503 and closed, and the read timeout closes the rest within
// seconds. The relay runs with 300 descriptors, as a small ulimit gives.
func TestSlowClientsDoNotTakeHealthzDown(t *testing.T) {
	t.Parallel()
	prlimit, err := exec.LookPath("prlimit")
	require.NoError(t, err, "the test bounds the relay's descriptors with prlimit (Debian's util-linux)")
	db, c := testdb.New(t), kafkatest.New(t)
	cmd := exec.Command(prlimit, "--nofile=300:300", "--", relayBin, "run")
	cmd.Env = append(testutil.CleanEnv(), append(runEnv(db, c), "PGBOX_CONSOLE_ADDR=127.0.0.1:0", "PGBOX_CONSOLE_TOKEN=token-0123456789abcdef")...)
	cmd.Stdout = io.Discard
	p := &proc{testutil.StartProc(t, cmd, listenRE)}
	httpAddr, consoleAddr := p.HTTPAddr(t), consoleAddr(t, p)

	const n = 300
	start := time.Now()
	slow := append(dialSlow(t, consoleAddr, n, false), dialSlow(t, httpAddr, n, false)...)
	other := otherClient()
	require.Equal(t, http.StatusOK, getFrom(t, other, "http://"+httpAddr+"/healthz"), "/healthz answers another client")
	require.Equal(t, http.StatusUnauthorized, getFrom(t, other, "http://"+consoleAddr+"/"), "the console answers another client")

	took := closedWithin(slow, httpReadTimeout+10*time.Second)
	refused := 0
	for i, d := range took {
		require.NotZero(t, d, "slow connection %d still open %v after the read timeout", i, httpReadTimeout+10*time.Second)
		if d < httpReadTimeout/2 {
			refused++
		}
	}
	require.GreaterOrEqual(t, refused, 2*(n-httpConnsPerClientDefault),
		"past %d per client and server, connections are closed at once", httpConnsPerClientDefault)
	t.Logf("%d slow connections closed within %v, %d of them at once", len(slow), time.Since(start).Round(time.Second), refused)
	require.Equal(t, http.StatusOK, getFrom(t, http.DefaultClient, "http://"+httpAddr+"/healthz"), "the slow client's address is served again")
	require.Equal(t, 0, p.stop(t), p.Output())
	require.NotContains(t, p.Output(), "too many open files")
}

// checkHTTPConnsPerClient: with 2, a client's third connection is answered
// 503 while another client is served.
func checkHTTPConnsPerClient(t *testing.T, set setFn) {
	db, c := testdb.New(t), kafkatest.New(t)
	p, base := startWith(t, set, "2", runEnv(db, c))
	addr := strings.TrimPrefix(base, "http://")
	dialSlow(t, addr, 2, true)
	third := dialSlow(t, addr, 1, true)[0]
	_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, http.StatusOK, getFrom(t, otherClient(), base+"/healthz"))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 0, p.stop(t), p.Output())
}
