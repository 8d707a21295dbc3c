package console_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
)

// proxyAuth is testAuth behind a trusted proxy on loopback (where the test
// server's clients come from) that names its user in X-Forwarded-User.
func proxyAuth(t *testing.T) func(*console.Config) {
	return func(c *console.Config) {
		c.Auth = testAuth(t)
		c.Auth.ProxyHeader = "X-Forwarded-User"
		c.Auth.ProxyOperators = []string{"olga"}
	}
}

// Issue 33 item 3: wrong basic logins through the proxy do not lock out
// everyone behind it: proxy-authenticated users and token holders are not
// throttled by address, and the throttle keys on the user.
func TestProxyUsersNotThrottledByAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, proxyAuth(t))
	for range 8 {
		code, _, _ := b.as("otto", "guess").do(t, "GET", "/", nil)
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, code)
	}
	code, _, _ := b.as("otto", operatorPass).do(t, "GET", "/", nil)
	require.Equal(t, http.StatusTooManyRequests, code, "the guessed user waits")
	olga := &client{b: b, hdr: map[string]string{"X-Forwarded-User": "olga"}}
	require.Contains(t, olga.get(t, "/"), "olga", "a proxy-authenticated user is not throttled by the proxy's address")
	bot := &client{b: b, hdr: map[string]string{"Authorization": "Bearer " + opsToken}}
	require.Contains(t, bot.get(t, "/"), "ops-bot", "nor is a token holder")
	require.Contains(t, b.as("vera", viewerPass).get(t, "/"), "vera", "nor another basic-auth user")
}

// Issue 33 item 4: a successful login clears its own user's count, not its
// address's: one account cannot spray guesses across user names.
func TestLoginSuccessClearsOnlyItsUser(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	vera := b.as("vera", viewerPass)
	throttled := 0
	for i := range 20 {
		code, _, _ := b.as("user-"+strings.Repeat("x", i), "guess").do(t, "GET", "/", nil)
		if code == http.StatusTooManyRequests {
			throttled++
		}
		code, _, _ = vera.do(t, "GET", "/", nil)
		if code == http.StatusTooManyRequests {
			throttled++
		}
	}
	require.Positive(t, throttled, "the address is throttled after 5 guesses though vera logs in between")
}

// Issue 33 item 11: a proxy header with more than one value (two header
// lines, or a comma-separated list) is refused, not its first value
// believed; the refusal is audited as a failed login.
func TestProxyHeaderWithSeveralValuesRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, proxyAuth(t))
	get := func(vals ...string) int {
		req, err := http.NewRequest("GET", b.srv.URL+"/", nil)
		require.NoError(t, err)
		for _, v := range vals {
			req.Header.Add("X-Forwarded-User", v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get("olga"))
	require.Equal(t, http.StatusUnauthorized, get("mallory", "olga"), "two header lines")
	require.Equal(t, http.StatusUnauthorized, get("mallory, olga"), "a list in one line")
	require.Equal(t, http.StatusUnauthorized, get(strings.Repeat("o", 300)), "a name longer than any login")
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit
		WHERE action = 'login' AND method = 'proxy' AND result = 'refused: wrong credentials'`))
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit WHERE actor = 'mallory, olga'`), "the audit names every value")
}

// Issue 33 item 10: what a request chooses cannot speak for the console.
// A failed login's name is cut to 256 bytes and shown quoted, as a claim; a
// flash shows only the viewer's own action, on its own page; an audit
// target holds only the console's known form fields.
func TestAuditAndFlashHoldNoInjectedContent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	lure := "URGENT — console moved, re-enter your password at console.example.net/login"
	code, _, _ := b.as(lure, "x").do(t, "GET", "/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = b.as(strings.Repeat("A", 700_000), "x").do(t, "GET", "/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	lureID := scalar[int64](t, b.db, `SELECT id FROM pgbox_console_audit WHERE actor = $1`, lure)
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit WHERE length(actor) < 300 AND actor LIKE 'AAAA%… (699744 bytes more)'`), "the 700,000-character name is cut")

	otto, vera := b.as("otto", operatorPass), b.as("vera", viewerPass)
	require.NotContains(t, otto.get(t, "/dead?done="+fmt.Sprint(lureID)), `id="flash"`, "a failed login is nobody's flash")
	audit := otto.get(t, "/audit")
	require.Contains(t, audit, `claimed <code>&#34;URGENT — console moved`, "the claimed name is shown quoted, as data")

	// Made-up field names are left out of the target, however many.
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	form := otto.confirmForm(t, "/parked/confirm?action=discard&ids="+fmt.Sprint(p))
	form.Set(`topic="nosuchtopic" note`, "x")
	for i := range 5000 {
		form.Set(fmt.Sprintf("junk%d", i), "x")
	}
	code, _, hdr := otto.do(t, "POST", "/parked/discard", form)
	require.Equal(t, http.StatusSeeOther, code)
	rec, err := console.ReadAudit(context.Background(), b.db.Pool, 1)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf(`confirmed="%d" ids="%d"`, p, p), rec[0].Target)
	require.Equal(t, "ok", rec[0].Result)

	// The flash is the operator's own, on the page the action returns to.
	done := "done=" + fmt.Sprint(rec[0].ID)
	require.Contains(t, hdr.Get("Location"), done)
	require.Contains(t, otto.get(t, "/parked?"+done), `id="flash"`)
	require.NotContains(t, otto.get(t, "/dead?"+done), `id="flash"`, "not on another page")
	require.NotContains(t, vera.get(t, "/parked?"+done), `id="flash"`, "not to another person")
}
