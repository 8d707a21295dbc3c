package console_test

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

func TestMain(m *testing.M) {
	// sarama's metrics registry starts a process-wide ticker on first use;
	// chromedp's browser process reaper outlives a test by a moment.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

const (
	viewerPass   = "viewer-secret"
	operatorPass = "operator-secret"
	opsToken     = "token-0123456789abcdef"
)

func hash(t testing.TB, pass string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	require.NoError(t, err)
	return string(h)
}

// testAuth has a viewer (vera), an operator (otto) and an operator token.
func testAuth(t testing.TB) console.Auth {
	return console.Auth{
		Users: []console.User{
			{Name: "vera", PasswordHash: hash(t, viewerPass)},
			{Name: "otto", PasswordHash: hash(t, operatorPass), Role: console.RoleOperator},
		},
		Tokens: []console.Token{{Name: "ops-bot", Token: opsToken, Role: console.RoleOperator}},
	}
}

type bundle struct {
	db  *testdb.DB
	srv *httptest.Server
	h   *console.Handler
}

func setup(t *testing.T, mod func(*console.Config)) *bundle {
	t.Helper()
	db := testdb.New(t)
	cfg := console.Config{DB: db.Pool, Auth: testAuth(t)}
	if mod != nil {
		mod(&cfg)
	}
	h, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &bundle{db: db, srv: srv, h: h}
}

// client is one person's requests: credentials set on each.
type client struct {
	b          *bundle
	user, pass string
	hdr        map[string]string
}

func (b *bundle) as(user, pass string) *client { return &client{b: b, user: user, pass: pass} }

func (c *client) do(t *testing.T, method, path string, form url.Values) (int, string, http.Header) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.b.srv.URL+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func (c *client) get(t *testing.T, path string) string {
	t.Helper()
	code, body, _ := c.do(t, "GET", path, nil)
	require.Equal(t, http.StatusOK, code, body)
	return body
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page served to c.
func (c *client) csrf(t *testing.T, path string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(c.get(t, path))
	require.NotNil(t, m, "no CSRF token on %s", path)
	return m[1]
}

func exec(t *testing.T, db *testdb.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func scalar[T any](t *testing.T, db *testdb.DB, sql string, args ...any) T {
	t.Helper()
	var v T
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&v))
	return v
}

// parkRow inserts one parked row and returns its id.
func parkRow(t *testing.T, db *testdb.DB, topic, key, value, errText string) int64 {
	t.Helper()
	hs, err := json.Marshal([]outbox.Header{{Key: "content-type", Value: []byte("application/json")}})
	require.NoError(t, err)
	return scalar[int64](t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, headers, attempts, last_error, parked_at)
		VALUES (gen_random_uuid(), $5, $1, $2, $3, $6, 5, $4, now()) RETURNING id`,
		topic, []byte(key), []byte(value), errText, slot.Of([]byte(key), outbox.EventID{}), string(hs))
}

// deadRow inserts one replayable dead letter of consumer svc and returns its id.
func deadRow(t *testing.T, db *testdb.DB, topic, key, value string, offset int64) int64 {
	t.Helper()
	hs, err := json.Marshal([]outbox.Header{{Key: "event-id", Value: []byte("ev-" + key)}})
	require.NoError(t, err)
	return scalar[int64](t, db, `INSERT INTO pgbox_consumer_dead
		(consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value, record_headers)
		VALUES ('svc', $1, 0, $4, $2, 3, 'account closed', $1 || '.dlq', true, $2::text::bytea, $3::text::bytea, $5)
		RETURNING id`, topic, key, value, offset, string(hs))
}

var hiddenRe = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// formOf reads the hidden fields of the (one) form on page.
func formOf(t *testing.T, page string) url.Values {
	t.Helper()
	f := url.Values{}
	for _, m := range hiddenRe.FindAllStringSubmatch(page, -1) {
		f.Add(m[1], html.UnescapeString(m[2]))
	}
	require.NotEmpty(t, f.Get("csrf"), "no form on the page")
	return f
}

// confirmForm is the form a confirmation page (path) posts when its "Yes"
// button is pressed.
func (c *client) confirmForm(t *testing.T, path string) url.Values {
	t.Helper()
	return formOf(t, c.get(t, path))
}

// token is the CSRF token of name, authenticated by method.
func (b *bundle) token(t *testing.T, name, method string) string {
	t.Helper()
	tok, err := b.h.CSRFTokenFor(context.Background(), console.Identity{Name: name, Method: method})
	require.NoError(t, err)
	return tok
}
