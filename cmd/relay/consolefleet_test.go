package main

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// fleetConsole is a client of a fleet console: basic auth as user, no
// redirect followed.
type fleetConsole struct {
	base, user string
}

func (c fleetConsole) do(t *testing.T, method, path string, form url.Values) (int, string, http.Header) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, consolePass)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func (c fleetConsole) get(t *testing.T, path string) string {
	t.Helper()
	code, body, _ := c.do(t, "GET", path, nil)
	require.Equal(t, http.StatusOK, code, body)
	return body
}

var (
	fleetRowRE    = regexp.MustCompile(`<tr[^>]*data-target="([^"]+)"`)
	hiddenInputRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// fleetOrder is the targets of a fleet overview page, in its order.
func fleetOrder(page string) []string {
	var names []string
	for _, m := range fleetRowRE.FindAllStringSubmatch(page, -1) {
		names = append(names, m[1])
	}
	return names
}

// fleetLine is the overview's line of the target name.
func fleetLine(t *testing.T, page, name string) string {
	t.Helper()
	i := strings.Index(page, `data-target="`+name+`"`)
	require.GreaterOrEqual(t, i, 0, "no line for %s", name)
	j := strings.Index(page[i:], "</tr>")
	return page[i : i+j]
}

func hiddenForm(t *testing.T, page string) url.Values {
	t.Helper()
	f := url.Values{}
	for _, m := range hiddenInputRE.FindAllStringSubmatch(page, -1) {
		f.Add(m[1], html.UnescapeString(m[2]))
	}
	require.NotEmpty(t, f.Get("csrf"), "no form on the page")
	return f
}

// `relay run --targets --console-addr`: the fleet overview lists every
// target, the worst first (a target whose schema is missing, one never
// migrated, then the served ones by their figures); each target's pages
// read its own schema only; an action on one target touches its rows only
// (two targets' parked rows with the same id) and is audited in its schema
// with its name; a form of one target is refused by another; an unknown
// target is a 404 naming it, after authentication.
func TestRunTargetsConsole(t *testing.T) {
	t.Parallel()
	acme, globex := testdb.New(t), testdb.New(t)
	behind := testdb.Empty(t)
	missing := "s_missing_" + strings.ReplaceAll(acme.Schema, "pgbox_test_", "")
	c := kafkatest.New(t, kfake.SeedTopics(1, "orders"))
	park := func(db *testdb.DB, key string) {
		opsExec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
			VALUES (gen_random_uuid(), 0, 'orders', $1, 'v', 5, 'MESSAGE_TOO_LARGE', now() - interval '1 hour')`, []byte(key))
	}
	park(acme, "acme-key-1")
	park(acme, "acme-key-2")
	park(globex, "globex-key-1")
	file := writeFile(t, "targets.txt", fmt.Sprintf("acme %s\nglobex %s\nbehind %s\nmissing %s\n", acme.Schema, globex.Schema, behind.Schema, missing))

	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_CONSOLE_ADDR=127.0.0.1:0",
		"PGBOX_CONSOLE_USERS="+consoleUsers(t), "PGBOX_CONSOLE_OPERATORS=otto"), "run")
	base := "http://" + consoleAddr(t, p)
	vera, otto := fleetConsole{base: base, user: "vera"}, fleetConsole{base: base, user: "otto"}

	// Unauthenticated: 401, whatever the target.
	code, _, _ := fleetConsole{base: base}.do(t, "GET", "/t/nobody/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = fleetConsole{base: base}.do(t, "GET", "/t/acme", nil)
	require.Equal(t, http.StatusUnauthorized, code, "a known name answers as an unknown one")
	code, _, _ = fleetConsole{base: base}.do(t, "GET", "/", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, hdr := vera.do(t, "GET", "/t/acme", nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/t/acme/", hdr.Get("Location"))

	// The overview: the figures are read in the background; once read,
	// the worst first.
	var page string
	waitFor(t, "every target's figures", time.Minute, func() bool {
		page = vera.get(t, "/")
		return strings.Count(page, `class="summary note">not read yet`) == 0 && !strings.Contains(page, "reading every target") &&
			strings.Contains(page, "Figures as of") && strings.Contains(fleetLine(t, page, "globex"), "running")
	})
	require.Equal(t, []string{"behind", "missing", "acme", "globex"}, fleetOrder(page), page)
	require.Contains(t, page, `4 targets, <span class="bad" id="fleet-problems">2 needing attention</span>`)
	require.Regexp(t, `(?s)refused: .*never migrated: run .*relay migrate up`, fleetLine(t, page, "behind"))
	require.Contains(t, fleetLine(t, page, "missing"), "refused")
	require.Contains(t, fleetLine(t, page, "missing"), `<span class="bad">no schema</span>`)
	acmeLine := fleetLine(t, page, "acme")
	require.Contains(t, acmeLine, `<span class="ok">ok</span>`)
	require.Regexp(t, `<td class="n">2</td><td class="n">0</td>`, acmeLine, "parked 2, dead 0")
	require.Regexp(t, `<td class="n">1</td><td class="n">0</td>`, fleetLine(t, page, "globex"), "parked 1, dead 0")

	// Filter and picker.
	require.Equal(t, []string{"acme"}, fleetOrder(vera.get(t, "/?q=acm")))
	require.Equal(t, []string{"behind", "missing"}, fleetOrder(vera.get(t, "/?state=problems")))
	code, _, hdr = vera.do(t, "GET", "/t?name=acme", nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/t/acme/", hdr.Get("Location"))

	// Unknown targets: 404 naming them.
	for _, path := range []string{"/t/nobody/", "/t/nobody/parked", "/t?name=nobody"} {
		code, body, _ := vera.do(t, "GET", path, nil)
		require.Equal(t, http.StatusNotFound, code, path)
		require.Contains(t, body, `no target named &#34;nobody&#34; in the target list`, path)
	}

	// A target's pages read its schema only; their links stay in it.
	ap := vera.get(t, "/t/acme/parked")
	require.Contains(t, ap, "acme-key-1")
	require.NotContains(t, ap, "globex-key-1")
	require.Contains(t, ap, `href="/t/acme/parked/row?id=1"`)
	require.Regexp(t, `Target <b>acme</b> · relay: <span id="target-state">running( \(dormant\))?</span>, [04] lanes held`, ap, "a target with no rows to publish may be dormant")
	_, body, _ := vera.do(t, "GET", "/t/missing/audit", nil)
	require.Regexp(t, `(?s)Target <b>missing</b> · relay: <span id="target-state">refused</span>, 0 lanes held · <span class="err">target &#34;missing&#34;.*does not exist`,
		body)
	require.Contains(t, vera.get(t, "/t/globex/parked"), "globex-key-1")
	require.Contains(t, vera.get(t, "/t/acme/"), "acme")
	code, body, _ = vera.do(t, "GET", "/t/missing/parked", nil)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "pgbox_outbox", "a missing schema's page says its tables are missing")

	// An action on acme: its row 1 only, not globex's row 1.
	form := hiddenForm(t, otto.get(t, "/t/acme/parked/confirm?action=retry&ids=1"))
	require.Equal(t, "1", form.Get("confirmed"))
	code, _, _ = otto.do(t, "POST", "/t/globex/parked/retry", form)
	require.Equal(t, http.StatusForbidden, code, "acme's form is refused by globex")
	code, body, hdr = otto.do(t, "POST", "/t/acme/parked/retry", form)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.True(t, strings.HasPrefix(hdr.Get("Location"), "/t/acme/parked?"), hdr.Get("Location"))
	require.Contains(t, otto.get(t, hdr.Get("Location")), "parked.retry by otto: ok (1 of 1 row)")
	require.Equal(t, 1, scalar(t, acme, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))
	require.Equal(t, 1, scalar(t, globex, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))
	require.Equal(t, 1, scalar(t, acme, `SELECT count(*) FROM pgbox_console_audit WHERE action = 'parked.retry' AND actor = 'otto' AND target LIKE 'fleet_target="acme" %'`))
	require.Equal(t, 0, scalar(t, globex, `SELECT count(*) FROM pgbox_console_audit WHERE action = 'parked.retry' AND result = 'ok'`))
	require.Regexp(t, `msg="console action" component=console fleet_target=acme .*action=parked.retry`, p.Output())

	// A viewer's action on a target is refused and audited there.
	form = hiddenForm(t, otto.get(t, "/t/globex/parked/confirm?action=discard&ids=1"))
	code, _, _ = vera.do(t, "POST", "/t/globex/parked/discard", form)
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, 1, scalar(t, globex, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`))
	require.Equal(t, 1, scalar(t, globex, `SELECT count(*) FROM pgbox_console_audit WHERE actor = 'vera' AND result LIKE 'refused: needs the operator role%'`))

	// A dead letter replayed on globex (through inspect.ReplayDead's own
	// transaction) lands in globex's outbox, not acme's.
	opsExec(t, globex, `INSERT INTO pgbox_consumer_dead
		(consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value, record_headers)
		VALUES ('svc', 'orders', 0, 7, 'zz-dead-letter', 3, 'account closed', 'orders.dlq', true, 'zz-dead-letter', 'v', '[]')`)
	require.Contains(t, vera.get(t, "/t/globex/dead"), "zz-dead-letter")
	require.NotContains(t, vera.get(t, "/t/acme/dead"), "zz-dead-letter")
	form = hiddenForm(t, otto.get(t, "/t/globex/dead/confirm?ids=1"))
	code, body, hdr = otto.do(t, "POST", "/t/globex/dead/replay", form)
	require.Equal(t, http.StatusSeeOther, code, body)
	require.Contains(t, otto.get(t, hdr.Get("Location")), "dead.replay by otto: ok (1 of 1 row)")
	require.Equal(t, 1, scalar(t, globex, `SELECT replays FROM pgbox_consumer_dead`))
	require.Equal(t, 0, scalar(t, acme, `SELECT count(*) FROM pgbox_consumer_dead`))

	require.Equal(t, 0, p.stop(t), p.Output())
}

func scalar(t *testing.T, db *testdb.DB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), sql).Scan(&n))
	return n
}

// targetDB, the console's view of one target over a shared pool: each of
// its calls reads the target's schema whatever the pool's search_path,
// leaves the pool's connections as they were, and holds at most its slots'
// connections, each given back when its transaction or rows end.
func TestTargetDBScopesToSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	acme, globex := testdb.New(t), testdb.New(t)
	opsExec(t, acme, `INSERT INTO pgbox_console_secret (name, value) VALUES ('which', 'acme')`)
	opsExec(t, globex, `INSERT INTO pgbox_console_secret (name, value) VALUES ('which', 'globex'), ('other', 'globex')`)
	// The pool's own search_path is acme's: a statement of globex's
	// targetDB must never read it.
	db := &targetDB{pool: acme.Pool, schema: globex.Schema, path: `"` + globex.Schema + `"`, slots: make(chan struct{}, 1)}

	var which string
	require.NoError(t, db.QueryRow(ctx, `SELECT convert_from(value, 'UTF8') FROM pgbox_console_secret WHERE name = 'which'`).Scan(&which))
	require.Equal(t, "globex", which)
	rows, err := db.Query(ctx, `SELECT name FROM pgbox_console_secret ORDER BY name`)
	require.NoError(t, err)
	var names []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		names = append(names, n)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"other", "which"}, names, "read to the end: its slot is given back")
	tag, err := db.Exec(ctx, `DELETE FROM pgbox_console_secret WHERE name = 'other'`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	require.Equal(t, 1, scalar(t, globex, `SELECT count(*) FROM pgbox_console_secret`))
	require.Equal(t, 1, scalar(t, acme, `SELECT count(*) FROM pgbox_console_secret`), "acme's table untouched")

	// One slot: a transaction holds it until it ends, rows until closed.
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = db.Begin(short)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the slot is held")
	require.NoError(t, tx.QueryRow(ctx, `SELECT convert_from(value, 'UTF8') FROM pgbox_console_secret`).Scan(&which))
	require.Equal(t, "globex", which)
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed, "after Commit: its slot is not given back twice")
	rows, err = db.Query(ctx, `SELECT name FROM pgbox_console_secret`)
	require.NoError(t, err)
	rows.Close()
	rows.Close()
	require.Empty(t, db.slots, "every slot given back once")

	var path string
	require.NoError(t, acme.Pool.QueryRow(ctx, `SHOW search_path`).Scan(&path))
	require.Contains(t, path, acme.Schema, "the pool's connections keep their own search_path")
}

// The fleet console opens no connection: with --db-conn-budget 4 (the
// check connection, a pool of 2 and its LISTEN), operators loading the
// overview and every target's pages at once leave the process within 4
// connections, and every target's figures are still read: with
// --target-metrics=off the reader's rounds run for the console alone.
func TestRunTargetsConsoleConnBudget(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("pgbox-console-budget-%d", time.Now().UnixNano())
	u, err := url.Parse(testdb.ServerURL(t))
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	var lines, names []string
	var first *testdb.DB
	for i := range 8 {
		db := testdb.New(t)
		if first == nil {
			first = db
		}
		name := fmt.Sprintf("tenant%d", i)
		names = append(names, name)
		lines = append(lines, fmt.Sprintf("%s %s %s", name, db.Schema, u.String()))
	}
	c := kafkatest.New(t)
	file := writeFile(t, "targets.txt", strings.Join(lines, "\n"))
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_DB_CONN_BUDGET=4", "PGBOX_CLEANUP_INTERVAL=0s", "PGBOX_TARGET_METRICS=off", "PGBOX_CONSOLE_ADDR=127.0.0.1:0",
		"PGBOX_CONSOLE_USERS="+consoleUsers(t)), "run")
	vera := fleetConsole{base: "http://" + consoleAddr(t, p), user: "vera"}

	most := 0
	sample := func() {
		var n int
		require.NoError(t, first.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n))
		most = max(most, n)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var pages atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				name := names[(w+i)%len(names)]
				for _, path := range []string{"/t/" + name + "/", "/t/" + name + "/parked", "/t/" + name + "/dead", "/?refresh=1"} {
					code, _, _ := vera.do(t, "GET", path, nil)
					if code != http.StatusOK {
						t.Errorf("%s: %d", path, code)
					}
					pages.Add(1)
				}
			}
		})
	}
	waitFor(t, "every target's figures read", time.Minute, func() bool {
		sample()
		page := vera.get(t, "/")
		return strings.Count(page, `<span class="ok">ok</span>`) == len(names)
	})
	for range 20 {
		sample()
		time.Sleep(100 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	t.Logf("at most %d connections, %d pages served", most, pages.Load())
	require.LessOrEqual(t, most, 4, "the budget")
	require.Equal(t, 0, p.stop(t), p.Output())
}
