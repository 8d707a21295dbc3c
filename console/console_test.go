package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inbox"
)

// every action the console has, with a form that would act on row id.
func actions(parked, dead int64) map[string]url.Values {
	return map[string]url.Values{
		"/parked/retry":   {"ids": {strconv.FormatInt(parked, 10)}, "confirmed": {strconv.FormatInt(parked, 10)}},
		"/parked/discard": {"ids": {strconv.FormatInt(parked, 10)}, "confirmed": {strconv.FormatInt(parked, 10)}},
		"/dead/replay":    {"ids": {strconv.FormatInt(dead, 10)}, "confirmed": {strconv.FormatInt(dead, 10)}, "replays": {"0"}},
	}
}

// unchanged checks that no action took effect.
func unchanged(t *testing.T, b *bundle, parked, dead int64) {
	t.Helper()
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE id = $1 AND parked_at IS NOT NULL`, parked), "parked row changed")
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT replays FROM pgbox_consumer_dead WHERE id = $1`, dead), "dead letter replayed")
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`), "outbox written")
}

func TestPagesRenderWithSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := parkRow(t, b.db, "payments.v1", "pay-1", `{"amount": 10}`, "MESSAGE_TOO_LARGE")
	d := deadRow(t, b.db, "orders.v1", "ord-1", "v", 7)
	exec(t, b.db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES ('svc', 'ord-2', 'orders.v1', 0, 8)`)
	vera := b.as("vera", viewerPass)
	for path, want := range map[string]string{
		"/":                                   "payments.v1",
		"/parked":                             "MESSAGE_TOO_LARGE",
		"/parked?topic=payments.v1&key=pay-1": "pay-1",
		"/parked/row?id=" + fmt.Sprint(p):     "&#34;amount&#34;: 10",
		"/dead":                               "account closed",
		"/dead?key=ord-1":                     "ord-1",
		"/dead/row?id=" + fmt.Sprint(d):       "ev-ord-1",
		"/cleanup":                            "no Kafka admin configured",
		"/story?topic=orders.v1&key=ord-1":    "account closed",
		"/story?topic=orders.v1&key=ord-2":    "ord-2",
		"/audit":                              "No action has been taken",
		"/parked/confirm?action=discard":      `id="confirm-count">1<`,
		"/dead/confirm?topic=orders.v1":       `id="confirm-count">1<`,
	} {
		code, body, hdr := vera.do(t, "GET", path, nil)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		require.Contains(t, body, want, path)
		require.Equal(t, "no-store", hdr.Get("Cache-Control"), path)
		csp := hdr.Get("Content-Security-Policy")
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.Contains(t, csp, "default-src 'none'", path)
		require.NotContains(t, csp, "script-src", path)
		require.NotContains(t, body, "<script", path)
		require.NotContains(t, body, "unsafe-inline", path)
	}
	// Relay instances, awake or asleep.
	exec(t, b.db, `INSERT INTO pgbox_relay_instances (instance, expires_at, sleeping) VALUES
		('relay-a', now() + interval '1 minute', true), ('relay-b', now() + interval '1 minute', false), ('relay-c', now() - interval '1 minute', false)`)
	over := vera.get(t, "/")
	require.Regexp(t, `relay-a</td><td><span class="ok">live, asleep`, over)
	require.Regexp(t, `relay-b</td><td><span class="ok">live, awake`, over)
	require.Regexp(t, `relay-c</td><td><span class="bad">expired`, over)
	// A key filter that matches nothing selects nothing (not every row).
	require.Contains(t, vera.get(t, "/parked?key=nope"), "No parked rows match")
	require.Contains(t, vera.get(t, "/dead?key=nope"), "No dead letters match")
	require.Contains(t, vera.get(t, "/dead?error=account+closed&key=ord-1"), "dead/row?id="+fmt.Sprint(d))
	require.Contains(t, vera.get(t, "/dead?error=nope"), "No dead letters match")
	require.Contains(t, vera.get(t, "/dead?error=account&key=nope"), "No dead letters match")
	// The viewer is shown no action.
	require.NotContains(t, vera.get(t, "/parked/row?id="+fmt.Sprint(p)), `action="/parked/retry"`)
	require.Contains(t, b.as("otto", operatorPass).get(t, "/parked/row?id="+fmt.Sprint(p)), `action="/parked/retry"`)
}

func TestUnauthenticatedAndViewerActionsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	d := deadRow(t, b.db, "orders.v1", "ord-1", "v", 7)
	vera := b.as("vera", viewerPass)
	token := b.token(t, "vera", "basic")
	for path, form := range actions(p, d) {
		// The viewer, with a valid token of her own: 403, and audited.
		f := url.Values{"csrf": {token}}
		for k, v := range form {
			f[k] = v
		}
		code, body, _ := vera.do(t, "POST", path, f)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "needs the operator role", path)
	}
	require.Contains(t, vera.get(t, "/audit"), "refused: needs the operator role")
	// Without a token (viewer pages have no action form, so a viewer's POST
	// has none), still a role refusal, audited, noting the token (issue 33
	// item 9); an operator's POST without one is refused, not audited.
	for path, form := range actions(p, d) {
		code, body, _ := vera.do(t, "POST", path, form)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "needs the operator role", path)
		code, _, _ = b.as("otto", operatorPass).do(t, "POST", path, form)
		require.Equal(t, http.StatusForbidden, code, path)
	}
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit
		WHERE actor = 'vera' AND method = 'basic' AND result = 'refused: needs the operator role (sent without a valid CSRF token)'`))
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit WHERE actor = 'otto'`))
	// GET on an action is not an action.
	code, _, _ := b.as("otto", operatorPass).do(t, "GET", "/parked/discard?ids="+fmt.Sprint(p)+"&expect=1", nil)
	require.Equal(t, http.StatusMethodNotAllowed, code)
	// No credentials, wrong password, unknown token: 401. Each bad
	// credential on one action only: past 5 failures this address waits.
	bad := []*client{b.as("otto", "wrong"), b.as("nobody", operatorPass),
		{b: b, hdr: map[string]string{"Authorization": "Bearer not-the-token-at-all"}}}
	i := 0
	for path, form := range actions(p, d) {
		for _, c := range []*client{b.as("", ""), bad[i]} {
			code, _, hdr := c.do(t, "POST", path, form)
			require.Equal(t, http.StatusUnauthorized, code, path)
			require.Contains(t, hdr.Get("WWW-Authenticate"), "Basic", path)
		}
		i++
	}
	unchanged(t, b, p, d)
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit WHERE actor = 'vera' AND result LIKE 'refused: needs the operator role'`))
}

// Without authentication, everyone is an anonymous viewer: nothing can act.
func TestNoAuthIsViewerOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Auth = console.Auth{} })
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	d := deadRow(t, b.db, "orders.v1", "ord-1", "v", 7)
	anon := b.as("", "")
	require.Contains(t, anon.get(t, "/"), "anonymous")
	token := b.token(t, "anonymous", "none")
	for path, form := range actions(p, d) {
		form.Set("csrf", token)
		code, _, _ := anon.do(t, "POST", path, form)
		require.Equal(t, http.StatusForbidden, code, path)
	}
	unchanged(t, b, p, d)
}

func TestCrossSitePostRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	d := deadRow(t, b.db, "orders.v1", "ord-1", "v", 7)
	otto := b.as("otto", operatorPass)
	token := otto.csrf(t, "/parked/confirm?action=retry")
	for path, form := range actions(p, d) {
		// A form on another site posting with the operator's credentials
		// (the browser resends basic auth): no token, or a token of
		// someone else, or from another origin even with the token.
		code, body, _ := otto.do(t, "POST", path, form)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "CSRF", path)
		f := url.Values{"csrf": {b.token(t, "vera", "basic")}}
		for k, v := range form {
			f[k] = v
		}
		code, _, _ = otto.do(t, "POST", path, f)
		require.Equal(t, http.StatusForbidden, code, path)
		f.Set("csrf", token)
		cross := &client{b: b, user: "otto", pass: operatorPass, hdr: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}}
		code, body, _ = cross.do(t, "POST", path, f)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "cross-origin", path)
	}
	unchanged(t, b, p, d)
}

func TestPayloadRenderedInert(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	evil := `<script>alert(1)</script><img src=x onerror=alert(2)>`
	p := parkRow(t, b.db, "payments.v1", `"><script>alert(3)</script>`, evil, `<b onmouseover=alert(4)>err</b>`)
	d := deadRow(t, b.db, "orders.v1", `<svg onload=alert(5)>`, evil, 1)
	otto := b.as("otto", operatorPass)
	for _, path := range []string{"/parked", "/parked/row?id=" + fmt.Sprint(p), "/dead", "/dead/row?id=" + fmt.Sprint(d),
		"/story?topic=orders.v1&key=" + url.QueryEscape(`<svg onload=alert(5)>`), "/parked?key=" + url.QueryEscape(`"><script>alert(3)</script>`)} {
		body := otto.get(t, path)
		for _, raw := range []string{"<script", "<img", "<svg", "<b onmouseover"} {
			require.NotContains(t, body, raw, path)
		}
		require.Contains(t, body, "alert(", path, "the payload is shown, escaped")
	}
	require.Contains(t, otto.get(t, "/parked/row?id="+fmt.Sprint(p)), "&lt;script&gt;alert(1)&lt;/script&gt;")
}

func TestHidePayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.HidePayloads = true })
	p := parkRow(t, b.db, "payments.v1", "card-4111", `{"pan": "4111111111111111"}`, "boom")
	d := deadRow(t, b.db, "orders.v1", "card-4242", "4242424242424242", 1)
	vera, otto := b.as("vera", viewerPass), b.as("otto", operatorPass)
	for _, path := range []string{"/parked", "/parked/row?id=" + fmt.Sprint(p), "/dead", "/dead/row?id=" + fmt.Sprint(d), "/story?topic=orders.v1&key=card-4242"} {
		who := vera
		if strings.Contains(path, "key=") {
			who = otto // a viewer may not look a key up while payloads are hidden
		}
		body := who.get(t, path)
		for _, secret := range []string{"4111111111111111", "4242424242424242", "card-4111", "ev-card-4242", "application/json"} {
			if strings.Contains(path, "key=card-4242") && secret == "card-4242" {
				continue // the operator typed it into the form
			}
			require.NotContains(t, body, secret, path)
		}
	}
}

func TestParkedRetryAndDiscardConfirmedBoundedAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.MaxActionRows = 2 })
	ctx := context.Background()
	a := parkRow(t, b.db, "payments.v1", "k1", "v", "UNKNOWN_TOPIC")
	parkRow(t, b.db, "payments.v1", "k2", "v", "UNKNOWN_TOPIC")
	parkRow(t, b.db, "payments.v1", "k3", "v", "MESSAGE_TOO_LARGE")
	otto := b.as("otto", operatorPass)

	// The list's "retry all matching" link carries the filter.
	m := regexp.MustCompile(`href="([^"]+)" id="retry-all"`).FindStringSubmatch(otto.get(t, "/parked?error=UNKNOWN&topic=payments.v1"))
	require.NotNil(t, m)
	require.Contains(t, otto.get(t, html.UnescapeString(m[1])), `id="confirm-count">2<`)

	// Three rows match: more than the 2 one action may touch.
	require.Contains(t, otto.get(t, "/parked/confirm?action=retry&topic=payments.v1"), `id="too-many"`)
	token := otto.csrf(t, "/parked/confirm?action=retry&error=UNKNOWN")
	code, _, hdr := otto.do(t, "POST", "/parked/retry", url.Values{"csrf": {token}, "topic": {"payments.v1"}, "confirmed": {"1,2,3"}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, otto.get(t, hdr.Get("Location")[len(""):]), "refused: the filter selects more than 2 rows")
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))

	// Rows other than the ones confirmed are refused.
	code, _, _ = otto.do(t, "POST", "/parked/retry", url.Values{"csrf": {token}, "error": {"UNKNOWN"}, "confirmed": {fmt.Sprint(a)}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))

	// Confirmed: the two UNKNOWN_TOPIC rows are unparked, attempts reset.
	code, _, hdr = otto.do(t, "POST", "/parked/retry", otto.confirmForm(t, "/parked/confirm?action=retry&error=UNKNOWN"))
	require.Equal(t, http.StatusSeeOther, code)
	page := otto.get(t, strings.TrimPrefix(hdr.Get("Location"), ""))
	require.Contains(t, page, "parked.retry by otto: ok (2 of 2 rows)")
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NULL AND attempts = 0`))

	// Discard one by key.
	code, _, _ = otto.do(t, "POST", "/parked/discard", otto.confirmForm(t, "/parked/confirm?action=discard&topic=payments.v1&key=k3"))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))

	recs, err := console.ReadAudit(ctx, b.db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, recs, 4)
	require.Equal(t, "parked.discard", recs[0].Action)
	require.Equal(t, "ok", recs[0].Result)
	require.EqualValues(t, 1, recs[0].Affected)
	require.Equal(t, "parked.retry", recs[1].Action)
	require.Equal(t, "otto", recs[1].Actor)
	require.Equal(t, console.RoleOperator, recs[1].Role)
	require.Len(t, recs[1].RowIDs, 2)
	require.Equal(t, a, recs[1].RowIDs[0])
	require.Contains(t, recs[2].Result, "refused: the rows changed since the confirmation (the filter now selects 2 rows, not the 1 row confirmed)")
	require.Contains(t, recs[3].Result, "refused: the filter selects more than 2 rows")
}

func TestDeadReplayAndReplayAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := deadRow(t, b.db, "orders.v1", "ord-1", "payload", 7)
	bot := &client{b: b, hdr: map[string]string{"Authorization": "Bearer " + opsToken}}
	token := bot.csrf(t, "/dead/row?id="+fmt.Sprint(d))
	form := url.Values{"csrf": {token}, "ids": {fmt.Sprint(d)}, "confirmed": {fmt.Sprint(d)}, "replays": {"0"}}
	code, _, _ := bot.do(t, "POST", "/dead/replay", form)
	require.Equal(t, http.StatusSeeOther, code)
	// The replay is in the outbox with its replay header.
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE topic = 'orders.v1' AND key = 'ord-1' AND headers @> $1::jsonb`,
		fmt.Sprintf(`[{"k": %q}]`, inbox.ReplayHeader)))
	// The same form again (the replay count it carries is gone) writes
	// nothing; "replay again" of the count now shown writes a new one.
	code, _, _ = bot.do(t, "POST", "/dead/replay", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
	require.Contains(t, bot.get(t, "/dead/row?id="+fmt.Sprint(d)), "Replay again")
	form.Set("again", "1")
	form.Set("replays", "1")
	code, _, _ = bot.do(t, "POST", "/dead/replay", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
	story := bot.get(t, "/story?topic=orders.v1&key=ord-1")
	require.Contains(t, story, fmt.Sprint(d)+".2", "the story shows the second replay")
	audit := bot.get(t, "/audit")
	require.Contains(t, audit, "dead.replay_again")
	require.Contains(t, audit, "ops-bot")
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	none := console.Auth{}
	for _, addr := range []string{"127.0.0.1:8081", "[::1]:8081", "localhost:8081"} {
		require.NoError(t, console.CheckListen(addr, none), addr)
	}
	for _, addr := range []string{":8081", "0.0.0.0:8081", "[::]:8081", "console.internal:8081"} {
		require.ErrorIs(t, console.CheckListen(addr, none), console.ErrNeedsAuth, addr)
		require.NoError(t, console.CheckListen(addr, testAuth(t)), addr)
	}
	require.Error(t, console.CheckListen("no-port", none))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := struct{ console.DB }{}
	for _, c := range []console.Config{
		{},
		{DB: db, MaxActionRows: -1},
		{DB: db, Prefix: "console"},
		{DB: db, Auth: console.Auth{Users: []console.User{{Name: "a", PasswordHash: "plain"}}}},
		{DB: db, Auth: console.Auth{Tokens: []console.Token{{Name: "t", Token: "short"}}}},
		{DB: db, Auth: console.Auth{Users: []console.User{{Name: "a", PasswordHash: hash(t, "x"), Role: "admin"}}}},
		{DB: db, Auth: console.Auth{ProxyOperators: []string{"x"}}},
	} {
		_, err := console.New(c)
		require.Error(t, err, "%+v", c)
	}
}

func TestTrustedProxyHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) {
		c.Auth = console.Auth{ProxyHeader: "X-Forwarded-User", ProxyOperators: []string{"olga"}}
	})
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	olga := &client{b: b, hdr: map[string]string{"X-Forwarded-User": "olga"}}
	require.Contains(t, olga.get(t, "/"), "olga")
	vic := &client{b: b, hdr: map[string]string{"X-Forwarded-User": "vic"}}
	token := b.token(t, "vic", "proxy")
	code, _, _ := vic.do(t, "POST", "/parked/discard", url.Values{"csrf": {token}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}})
	require.Equal(t, http.StatusForbidden, code)
	token = olga.csrf(t, "/parked/row?id="+fmt.Sprint(p))
	code, _, _ = olga.do(t, "POST", "/parked/discard", url.Values{"csrf": {token}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
	// Without the header there is no one.
	code, _, _ = b.as("", "").do(t, "GET", "/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
}

// Replaying every dead letter a filter selects: confirmed count, bounded.
func TestDeadReplayMatchingFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	deadRow(t, b.db, "orders.v1", "ord-1", "v", 1)
	deadRow(t, b.db, "orders.v1", "ord-2", "v", 2)
	deadRow(t, b.db, "refunds.v1", "ref-1", "v", 3)
	otto := b.as("otto", operatorPass)
	m := regexp.MustCompile(`href="([^"]+)" id="replay-all"`).FindStringSubmatch(otto.get(t, "/dead?topic=orders.v1"))
	require.NotNil(t, m)
	page := otto.get(t, html.UnescapeString(m[1]))
	require.Contains(t, page, `id="confirm-count">2<`)
	require.Contains(t, page, `<form method="post" action="/dead/replay">`)
	require.Contains(t, page, `<input type="hidden" name="topic" value="orders.v1">`)
	code, _, hdr := otto.do(t, "POST", "/dead/replay", formOf(t, page))
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, otto.get(t, hdr.Get("Location")), "dead.replay by otto: ok (2 of 2 rows)")
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE topic = 'orders.v1'`))
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT replays FROM pgbox_consumer_dead WHERE topic = 'refunds.v1'`))
}

// An action whose audit record cannot be written is not taken.
func TestNoAuditNoAction(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	otto := b.as("otto", operatorPass)
	token := otto.csrf(t, "/parked/row?id="+fmt.Sprint(p))
	exec(t, b.db, `DROP TABLE pgbox_console_audit`)
	code, body, _ := otto.do(t, "POST", "/parked/discard", url.Values{"csrf": {token}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}})
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "relay migrate up")
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE id = $1`, p), "the row is still there")
}

// Mounted under a prefix, links, forms and redirects keep it.
func TestPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Prefix = "/ops/console" })
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	otto := b.as("otto", operatorPass)
	code, _, _ := otto.do(t, "GET", "/parked", nil)
	require.Equal(t, http.StatusNotFound, code)
	page := otto.get(t, "/ops/console/parked/row?id="+fmt.Sprint(p))
	require.Contains(t, page, `href="/ops/console/static/style.css"`)
	require.Contains(t, page, `action="/ops/console/parked/discard"`)
	code, _, hdr := otto.do(t, "POST", "/ops/console/parked/discard",
		url.Values{"csrf": {csrfRe.FindStringSubmatch(page)[1]}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}})
	require.Equal(t, http.StatusSeeOther, code)
	require.True(t, strings.HasPrefix(hdr.Get("Location"), "/ops/console/parked?"), hdr.Get("Location"))
	require.Contains(t, otto.get(t, hdr.Get("Location")), "parked.discard by otto: ok")
	code, _, _ = otto.do(t, "GET", "/ops/console/static/style.css", nil)
	require.Equal(t, http.StatusOK, code)
}
