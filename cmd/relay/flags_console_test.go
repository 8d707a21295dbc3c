package main

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// The console's settings, each observed through what the console serves.
func init() {
	for name, c := range map[string]flagCheck{
		"console-addr":            {check: checkConsoleAddr, bad: "not-an-address"},
		"console-users":           {check: checkConsoleUsers, bad: "otto-without-hash"},
		"console-token":           {check: checkConsoleToken, bad: "short"},
		"console-operators":       {check: checkConsoleOperators},
		"console-proxy-header":    {check: checkConsoleProxyHeader},
		"console-proxy-operators": {check: checkConsoleProxyOperators},
		"console-hide-payloads":   {check: checkConsoleHidePayloads, bad: "maybe"},
	} {
		flagChecks[name] = c
	}
}

var consoleListenRE = regexp.MustCompile(`msg="console listening" addr=(\S+)`)

const consolePass = "console-password"

func consoleUsers(t *testing.T) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(consolePass), bcrypt.MinCost)
	require.NoError(t, err)
	return "vera:" + string(h) + ",otto:" + string(h)
}

// startConsole runs the relay with the setting and env, and returns the
// console's base URL.
func startConsole(t *testing.T, set setFn, v string, env []string) (*proc, string, *testdb.DB) {
	t.Helper()
	db, c := testdb.New(t), kafkatest.New(t)
	a, e := with(set, v, append(runEnv(db, c), env...), "run")
	p := startRelay(t, e, a...)
	return p, "http://" + consoleAddr(t, p), db
}

// consoleAddr waits for p's console to listen and returns its address.
func consoleAddr(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	waitFor(t, "console listening", time.Minute, func() bool {
		m := consoleListenRE.FindStringSubmatch(p.Output())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// consoleGet requests path with hdr set and returns the status and body.
func consoleGet(t *testing.T, url string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		if k == "basic" {
			name, pass, _ := strings.Cut(v, ":")
			req.SetBasicAuth(name, pass)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func checkConsoleAddr(t *testing.T, set setFn) {
	p, base, _ := startConsole(t, set, "127.0.0.1:0", nil)
	code, body := consoleGet(t, base+"/", nil)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "unpublished outbox rows")
	require.Contains(t, body, "anonymous")
	require.Equal(t, 0, p.stop(t), p.Output())

	// Not loopback and no authentication: refused before anything starts.
	db := testdb.New(t)
	r := runWith(t, set, "0.0.0.0:0", []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=127.0.0.1:1"}, "run")
	require.Equal(t, 2, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "PGBOX_CONSOLE_ADDR (--console-addr)")
	require.Contains(t, r.Stderr, "no authentication")
}

func checkConsoleUsers(t *testing.T, set setFn) {
	p, base, _ := startConsole(t, set, consoleUsers(t), []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0"})
	code, _ := consoleGet(t, base+"/", nil)
	require.Equal(t, 401, code)
	code, _ = consoleGet(t, base+"/", map[string]string{"basic": "vera:wrong"})
	require.Equal(t, 401, code)
	code, body := consoleGet(t, base+"/", map[string]string{"basic": "vera:" + consolePass})
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `vera · <span class="role role-viewer">viewer`)
	require.NotContains(t, p.Output(), "$2a$", "the hashes are never logged")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkConsoleToken(t *testing.T, set setFn) {
	const tok = "console-token-0123456789"
	p, base, _ := startConsole(t, set, tok, []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0"})
	code, _ := consoleGet(t, base+"/", nil)
	require.Equal(t, 401, code)
	code, body := consoleGet(t, base+"/", map[string]string{"Authorization": "Bearer " + tok})
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "token · ")
	require.NotContains(t, p.Output(), tok, "the token is never logged")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkConsoleOperators(t *testing.T, set setFn) {
	p, base, _ := startConsole(t, set, "otto", []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0", "PGBOX_CONSOLE_USERS=" + consoleUsers(t)})
	_, body := consoleGet(t, base+"/", map[string]string{"basic": "otto:" + consolePass})
	require.Contains(t, body, `otto · <span class="role role-operator">operator`)
	_, body = consoleGet(t, base+"/", map[string]string{"basic": "vera:" + consolePass})
	require.Contains(t, body, `vera · <span class="role role-viewer">viewer`)
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkConsoleProxyHeader(t *testing.T, set setFn) {
	p, base, _ := startConsole(t, set, "X-Auth-User", []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0"})
	code, _ := consoleGet(t, base+"/", nil)
	require.Equal(t, 401, code)
	code, body := consoleGet(t, base+"/", map[string]string{"X-Auth-User": "olga"})
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "olga · ")
	require.Equal(t, 0, p.stop(t), p.Output())
}

func checkConsoleHidePayloads(t *testing.T, set setFn) {
	p, base, db := startConsole(t, set, "true", []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0"})
	opsExec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		VALUES (gen_random_uuid(), 0, 'payments', 'card-key', 'card-4111111111111111', 5, 'boom', now())`)
	code, body := consoleGet(t, base+"/parked/row?id=1", nil)
	require.Equal(t, 200, code, body)
	require.NotContains(t, body, "4111111111111111")
	require.NotContains(t, body, "card-key")
	require.Contains(t, body, "payload display is off")
	require.Equal(t, 0, p.stop(t), p.Output())
}

// Proxy users have an operator list of their own: --console-operators
// naming "olga" does not make the proxy user olga an operator.
func checkConsoleProxyOperators(t *testing.T, set setFn) {
	p, base, _ := startConsole(t, set, "olga", []string{"PGBOX_CONSOLE_ADDR=127.0.0.1:0", "PGBOX_CONSOLE_PROXY_HEADER=X-Auth-User",
		"PGBOX_CONSOLE_OPERATORS=token,vic"})
	_, body := consoleGet(t, base+"/", map[string]string{"X-Auth-User": "olga"})
	require.Contains(t, body, `olga · <span class="role role-operator">operator`)
	_, body = consoleGet(t, base+"/", map[string]string{"X-Auth-User": "token"})
	require.Contains(t, body, `token · <span class="role role-viewer">viewer`, "a proxy user named token is not the token's holder")
	_, body = consoleGet(t, base+"/", map[string]string{"X-Auth-User": "vic"})
	require.Contains(t, body, `vic · <span class="role role-viewer">viewer`)
	require.Equal(t, 0, p.stop(t), p.Output())
}
