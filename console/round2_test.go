package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupkgo"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testutil"
)

// Issue 27, item 1: a confirmed bulk action touches exactly the rows its
// confirmation showed. A row discarded elsewhere and a new row of the same
// filter meanwhile: the action is refused and touches nothing.
func TestBulkActionTouchesOnlyConfirmedRows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var ids []int64
	for i := range 5 {
		ids = append(ids, parkRow(t, b.db, "nope.v1", fmt.Sprintf("k%d", i), "v", "UNKNOWN_TOPIC_OR_PARTITION"))
	}
	otto := b.as("otto", operatorPass)
	form := otto.confirmForm(t, "/parked/confirm?action=discard&topic=nope.v1")
	require.Equal(t, joinIDs(ids), form.Get("confirmed"))
	exec(t, b.db, `DELETE FROM pgbox_outbox WHERE id = $1`, ids[4]) // discarded elsewhere
	newcomer := parkRow(t, b.db, "nope.v1", "k-new", "v", "UNKNOWN_TOPIC_OR_PARTITION")
	code, _, hdr := otto.do(t, "POST", "/parked/discard", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, otto.get(t, hdr.Get("Location")), "refused: the rows changed since the confirmation")
	require.Equal(t, 5, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE topic = 'nope.v1'`), "nothing discarded")
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE id = $1`, newcomer))
	// Confirmed again, it discards the five it now shows.
	code, _, _ = otto.do(t, "POST", "/parked/discard", otto.confirmForm(t, "/parked/confirm?action=discard&topic=nope.v1"))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
	// A form without the confirmed ids is refused.
	p := parkRow(t, b.db, "nope.v1", "k-late", "v", "boom")
	code, _, _ = otto.do(t, "POST", "/parked/discard", url.Values{"csrf": {otto.csrf(t, "/parked/row?id="+fmt.Sprint(p))}, "topic": {"nope.v1"}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE id = $1`, p))
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return strings.Join(s, ",")
}

// Item 2: failed logins are logged and audited (user, source, method) and,
// past a few, refused for a while, even with the right password.
func TestFailedLoginsLoggedAuditedThrottled(t *testing.T) {
	t.Parallel()
	var logs testutil.SyncBuffer
	b := setup(t, func(c *console.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	guess := b.as("otto", "guess")
	for range 5 {
		code, _, _ := guess.do(t, "GET", "/", nil)
		require.Equal(t, http.StatusUnauthorized, code)
	}
	code, _, _ := guess.do(t, "GET", "/", nil)
	require.Equal(t, http.StatusUnauthorized, code, "the sixth failure is still checked, and starts the wait")
	code, _, hdr := b.as("otto", operatorPass).do(t, "GET", "/", nil)
	require.Equal(t, http.StatusTooManyRequests, code, "the user waits after repeated failures")
	require.NotEmpty(t, hdr.Get("Retry-After"))
	// Another source address is throttled too once the name is: a guessing
	// campaign spread over addresses still slows down per user.
	require.Equal(t, 6, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit
		WHERE action = 'login' AND actor = 'otto' AND method = 'basic' AND result = 'refused: wrong credentials' AND target LIKE 'source="127.0.0.1"%'`))
	require.Equal(t, 6, strings.Count(logs.String(), `msg="console login failed" user=otto auth=basic source=127.0.0.1 method=GET`), logs.String())
	// A different user from elsewhere is unaffected by otto's count, but
	// this source address is throttled as well.
	code, _, _ = b.as("vera", viewerPass).do(t, "GET", "/", nil)
	require.Equal(t, http.StatusTooManyRequests, code, "the source address waits too")
}

// Item 3: with HidePayloads, keys inside error texts, a handler's own error
// text, and keys typed into filters (as the audit records them) are hidden.
func TestHidePayloadsHidesDerivedText(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.HidePayloads = true })
	d := deadRow(t, b.db, "orders.v1", "orders.v1/2/0", "v", 1)
	exec(t, b.db, `UPDATE pgbox_consumer_dead SET error = $2 WHERE id = $1`, d,
		`inbox: consumer "svc", message orders.v1/2@0, key "orders.v1/2/0": handler: card 4111111111111111 declined`)
	p := parkRow(t, b.db, "payments.v1", "card-4111", "v", `kafka: key "card-4111" rejected`)
	otto := b.as("otto", operatorPass)
	for _, path := range []string{"/dead", "/dead/row?id=" + fmt.Sprint(d), "/story?event=" + "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		"/parked", "/parked/row?id=" + fmt.Sprint(p)} {
		body := otto.get(t, path)
		for _, secret := range []string{"orders.v1/2/0", "4111111111111111", "card-4111"} {
			require.NotContains(t, body, secret, path)
		}
	}
	require.Contains(t, otto.get(t, "/dead"), "handler error (30 characters, hidden)")
	code, _, _ := otto.do(t, "POST", "/parked/discard", otto.confirmForm(t, "/parked/confirm?action=discard&key=card-4111"))
	require.Equal(t, http.StatusSeeOther, code)
	audit := otto.get(t, "/audit")
	require.NotContains(t, audit, "card-4111")
	require.Contains(t, audit, `key=&#34;(hidden)&#34;`)
}

// Item 4: the audit records how each person authenticated: a proxy user
// named "token" is told apart from the bearer token named "token".
func TestAuditNamesAuthMethod(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) {
		c.Auth = console.Auth{ProxyHeader: "X-Forwarded-User",
			Tokens: []console.Token{{Name: "token", Token: opsToken, Role: console.RoleOperator}}}
	})
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	form := func(tok string) url.Values {
		return url.Values{"csrf": {tok}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}}
	}
	proxy := &client{b: b, hdr: map[string]string{"X-Forwarded-User": "token"}}
	code, _, _ := proxy.do(t, "POST", "/parked/retry", form(b.token(t, "token", "proxy")))
	require.Equal(t, http.StatusForbidden, code, "the proxy user is a viewer")
	bot := &client{b: b, hdr: map[string]string{"Authorization": "Bearer " + opsToken}}
	code, _, _ = bot.do(t, "POST", "/parked/retry", form(b.token(t, "token", "bearer")))
	require.Equal(t, http.StatusSeeOther, code)
	recs, err := console.ReadAudit(context.Background(), b.db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	require.Equal(t, "bearer", recs[0].Method)
	require.Equal(t, "ok", recs[0].Result)
	require.Equal(t, "proxy", recs[1].Method)
	require.Contains(t, bot.get(t, "/audit"), "<td>proxy</td>")
}

// Item 5: two consoles on one database accept each other's forms (the CSRF
// key is kept in the database), as replicas behind the shipped manifest do.
func TestReplicasShareCSRFKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	other, err := console.New(console.Config{DB: b.db.Pool, Auth: testAuth(t)})
	require.NoError(t, err)
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	tok, err := other.CSRFTokenFor(context.Background(), console.Identity{Name: "otto", Method: "basic"})
	require.NoError(t, err)
	code, _, _ := b.as("otto", operatorPass).do(t, "POST", "/parked/discard",
		url.Values{"csrf": {tok}, "ids": {fmt.Sprint(p)}, "confirmed": {fmt.Sprint(p)}})
	require.Equal(t, http.StatusSeeOther, code, "a form served by the other console is accepted")
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
}

// hangingAdmin is a cleanup admin over a broker that accepts connections
// and never answers.
func hangingAdmin(t *testing.T) *cleanup.CutoffsConfig {
	t.Helper()
	addr, _ := kafkatest.HangingBroker(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &cleanup.CutoffsConfig{Admin: cleanupkgo.New(kadm.NewClient(cl)), KafkaTimeout: time.Minute}
}

// Item 6: a Kafka that hangs costs the overview and the cleanup page a
// note, not the page: the database's sections render, the Kafka-derived
// parts say Kafka is not answering.
func TestPagesWithHangingKafka(t *testing.T) {
	t.Parallel()
	cut := hangingAdmin(t)
	b := setup(t, func(c *console.Config) {
		c.Inspect = inspect.Config{Cutoffs: cut}
		c.KafkaWait = 200 * time.Millisecond
	})
	parkRow(t, b.db, "payments.v1", "pay-1", "v", "boom")
	exec(t, b.db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset") VALUES ('svc', 'k', 'orders.v1', 0, 1)`)
	vera := b.as("vera", viewerPass)
	over := vera.get(t, "/")
	require.Contains(t, over, `id="kafka-down"`)
	require.Contains(t, over, "Kafka is not answering (no answer within 200ms)")
	require.Contains(t, over, `id="parkedcounts"`, "the database's sections render")
	require.Contains(t, over, "orders.v1")
	page := vera.get(t, "/cleanup")
	require.Contains(t, page, "Kafka is not answering")
	require.Contains(t, page, "not pruned this pass: Kafka unreachable")
	require.NotContains(t, page, "<td>0</td><td>0</td>", "retention and segment are unknown, not zero")
	require.NotContains(t, page, "kept forever")
}

// Item 7: the publish-rate card shows a rate from the second load on.
func TestPublishRateCard(t *testing.T) {
	t.Parallel()
	var n atomic.Uint64
	b := setup(t, func(c *console.Config) { c.Published = func() uint64 { return n.Add(10) } })
	vera := b.as("vera", viewerPass)
	vera.get(t, "/")
	page := vera.get(t, "/")
	require.NotContains(t, page, "%!")
	require.Regexp(t, `<div class="num">[0-9.]+/s</div><div>published \(this process\)`, page)
}

// Item 8: an instance that cannot reach Kafka shows what relay status says.
func TestInstanceKafkaStateShown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exec(t, b.db, `INSERT INTO pgbox_relay_instances (instance, expires_at, kafka_ready, kafka_down_since) VALUES
		('relay-down', now() + interval '1 minute', true, now() - interval '5 minutes'),
		('relay-new', now() + interval '1 minute', false, NULL)`)
	over := b.as("vera", viewerPass).get(t, "/")
	require.Regexp(t, `relay-down</td><td><span class="bad">running, Kafka unreachable since `, over)
	require.Regexp(t, `relay-new</td><td><span class="bad">running, connecting to Kafka`, over)
}

// Item 9: counts that stopped at the exact limit say so ("≥ 1,000").
func TestCappedCountsMarked(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Inspect = inspect.Config{ExactLimit: 1000} })
	exec(t, b.db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		SELECT gen_random_uuid(), g % 256, 'big.v1', convert_to('k' || g, 'UTF8'), 'v', 5, 'boom', now() FROM generate_series(1, 1100) g`)
	over := b.as("vera", viewerPass).get(t, "/")
	require.Contains(t, over, `<div class="num">≥ 1,000</div><div>parked rows</div>`)
	require.Contains(t, over, `big.v1</a></td><td class="n">≥ 1,000</td>`)
	require.Contains(t, b.as("vera", viewerPass).get(t, "/parked"), `<span id="parked-count">1,100</span>`)
}

// Item 11: the overview charts the last hour per topic from the relay's
// history samples, as SVG, without script.
func TestOverviewChart(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	vera := b.as("vera", viewerPass)
	require.Contains(t, vera.get(t, "/"), `id="chart-empty"`)
	exec(t, b.db, `INSERT INTO pgbox_relay_history (at, topic, backlog, published)
		SELECT now() - g * interval '1 minute', t, 100 + g, 600 FROM generate_series(0, 59) g, unnest(ARRAY['', 'orders.v1', 'payments.v1']) t`)
	over := vera.get(t, "/")
	require.Contains(t, over, `id="chart"`)
	require.Equal(t, 4, strings.Count(over, "<polyline"), "backlog and rate lines of two topics")
	require.Contains(t, over, "<title>orders.v1</title>")
	require.Contains(t, over, "max 159")
	require.Contains(t, over, "max 10.0", "600 rows a minute: 10/s")
	require.NotContains(t, over, "<script")
}

// Item 12: the dead-letter list shows the handler's error first; audit
// targets have one format and wrap.
func TestDeadErrorHandlerFirstAndAuditFormat(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := deadRow(t, b.db, "orders.v1", "ord-1", "v", 1)
	exec(t, b.db, `UPDATE pgbox_consumer_dead SET error = $2 WHERE id = $1`, d,
		`inbox: consumer "payments-service-with-a-long-name", message orders.v1/2@12345678, key "orders.v1/2/12345678": handler: plain failure`)
	otto := b.as("otto", operatorPass)
	require.Contains(t, otto.get(t, "/dead"), `<td class="err">plain failure — handler, inbox: consumer`)
	vera := b.as("vera", viewerPass)
	code, _, _ := vera.do(t, "POST", "/dead/replay", url.Values{"csrf": {b.token(t, "vera", "basic")}, "ids": {fmt.Sprint(d)}, "confirmed": {fmt.Sprint(d)}, "replays": {"0"}})
	require.Equal(t, http.StatusForbidden, code)
	code, _, _ = otto.do(t, "POST", "/dead/replay", otto.confirmForm(t, "/dead/confirm?ids="+fmt.Sprint(d)))
	require.Equal(t, http.StatusSeeOther, code)
	recs, err := console.ReadAudit(context.Background(), b.db.Pool, 10)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	want := fmt.Sprintf(`confirmed="%d" ids="%d" replays="0"`, d, d)
	require.Equal(t, want, recs[0].Target)
	require.Equal(t, want, recs[1].Target, "a refusal records the same format")
	require.Contains(t, otto.get(t, "/audit"), `<td class="mono wrap">`)
}

// Item 13: the confirmation lists the rows, has a cancel link, says "1
// row", and shows a viewer no button.
func TestConfirmationPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	p := parkRow(t, b.db, "payments.v1", "pay-1", "v", "MESSAGE_TOO_LARGE")
	page := b.as("otto", operatorPass).get(t, "/parked/confirm?action=discard&topic=payments.v1")
	require.Contains(t, page, fmt.Sprintf(`<a href="/parked/row?id=%d">%d</a>`, p, p))
	require.Contains(t, page, "payments.v1 pay-1")
	require.Contains(t, page, "Yes, discard 1 row<")
	require.Contains(t, page, `href="/parked?topic=payments.v1" id="cancel"`)
	viewer := b.as("vera", viewerPass).get(t, "/parked/confirm?action=discard&topic=payments.v1")
	require.NotContains(t, viewer, `id="confirm"`)
	require.NotContains(t, viewer, "<form method=\"post\"")
	require.Contains(t, viewer, `id="viewer-note"`)
	for range 24 {
		parkRow(t, b.db, "payments.v1", "more", "v", "boom")
	}
	page = b.as("otto", operatorPass).get(t, "/parked/confirm?action=retry&topic=payments.v1")
	require.Contains(t, page, "and 5 rows more")
}

// Item 14: bidi controls in keys, errors and consumer names are shown
// escaped.
func TestBidiControlsEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := deadRow(t, b.db, "orders.v1", "abc\u202edef", "v", 1)
	exec(t, b.db, `UPDATE pgbox_consumer_dead SET consumer = $2, error = $3 WHERE id = $1`, d, "svc\u2066x", "boom \u202a here")
	otto := b.as("otto", operatorPass)
	for _, path := range []string{"/dead", "/dead/row?id=" + fmt.Sprint(d), "/"} {
		body := otto.get(t, path)
		for _, r := range []string{"\u202e", "\u2066", "\u202a"} {
			require.NotContains(t, body, r, path)
		}
	}
	require.Contains(t, otto.get(t, "/dead"), `abc\u202Edef`)
	require.Contains(t, otto.get(t, "/dead"), `svc\u2066x`)
}

// Item 15: bad parameters get a 400 naming the parameter; a refused action
// is audited.
func TestBadParametersAre400(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	otto := b.as("otto", operatorPass)
	for path, name := range map[string]string{
		"/parked?topic=%FF":                   "topic",
		"/dead?key=%FF":                       "key",
		"/dead?consumer=%FF":                  "consumer",
		"/parked?ids=-1":                      "ids",
		"/parked/confirm?action=retry&ids=-1": "ids",
		"/story?topic=t&key=%FF":              "key",
		"/story?event=x":                      "event",
		"/parked/row?id=x":                    "id",
		"/dead/row?id=0":                      "id",
	} {
		code, body, _ := otto.do(t, "GET", path, nil)
		require.Equal(t, http.StatusBadRequest, code, path)
		require.Contains(t, body, "parameter "+name, path)
	}
	tok := otto.csrf(t, "/parked/row?id="+fmt.Sprint(parkRow(t, b.db, "t", "k", "v", "boom")))
	for _, form := range []url.Values{{"ids": {"-1"}, "confirmed": {"1"}}, {"topic": {"\xff"}, "confirmed": {"1"}}, {"confirmed": {"x"}}} {
		form.Set("csrf", tok)
		code, body, _ := otto.do(t, "POST", "/parked/discard", form)
		require.Equal(t, http.StatusBadRequest, code, form)
		require.Contains(t, body, "parameter ", form)
	}
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_console_audit WHERE result LIKE 'refused: parameter %'`))
	require.Equal(t, 1, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`))
}
