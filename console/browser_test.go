package console_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/relay"
)

// ScreenshotsEnv, when set (make screenshots), makes TestBrowser save its
// screenshots into docs/.
const screenshotsEnv = "PGBOX_SCREENSHOTS"

var (
	chromiumOnce sync.Once
	chromiumBin  string
	chromiumErr  error
)

// chromium finds a Chromium, installing Debian's package when there is none
// and the tests run as root (as scripts/devdb.sh installs PostgreSQL).
func chromium(t *testing.T) string {
	t.Helper()
	chromiumOnce.Do(func() {
		find := func() string {
			for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
				if p, err := osexec.LookPath(name); err == nil {
					return p
				}
			}
			return ""
		}
		if chromiumBin = find(); chromiumBin != "" {
			return
		}
		if _, err := osexec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
			chromiumErr = fmt.Errorf("no Chromium found: install Debian's chromium package (apt-get install chromium), or run the tests as root, which installs it")
			return
		}
		for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", "chromium"}} {
			cmd := osexec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			if out, err := cmd.CombinedOutput(); err != nil {
				chromiumErr = fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
		if chromiumBin = find(); chromiumBin == "" {
			chromiumErr = fmt.Errorf("apt-get installed chromium, but no chromium binary is on PATH")
		}
	})
	require.NoError(t, chromiumErr)
	return chromiumBin
}

// browser starts headless Chromium logged in to the console as user.
func browser(t *testing.T, user, pass string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(chromium(t)),
			chromedp.NoSandbox, // root in CI containers
			chromedp.WindowSize(1280, 900))...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	// Log in: the browser sends the basic-auth credentials with every request.
	cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Basic " + cred}})
	require.NoError(t, err)
	return ctx
}

// steps runs browser steps, each bounded so that a missing element fails
// the test instead of hanging it.
func steps(t *testing.T, ctx context.Context, acts ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, acts...))
}

// text returns the text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err)
	return s
}

// shot saves a full-page screenshot as docs/<name>.png under make screenshots.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv(screenshotsEnv) == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("..", "docs", name+".png"), png, 0o644))
}

// payments is a consumer of payments.v1 through the sarama adapter; its
// handler fails (permanently: dead letter at once) while broken is set.
type payments struct {
	h      *inboxsarama.Handler
	broken sync.Map // event -> true
}

func startPayments(t *testing.T, db *testdb.DB, addrs []string) *payments {
	t.Helper()
	exec(t, db, `CREATE TABLE charges (event text NOT NULL, inbox_offset bigint NOT NULL)`)
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	require.NoError(t, err)
	p := &payments{}
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		ev, _ := m.Header("event-id")
		if _, bad := p.broken.Load(string(ev)); bad {
			return inbox.Permanent(fmt.Errorf("charge %s: card processor rejected the currency", ev))
		}
		_, err := tx.Exec(ctx, `INSERT INTO charges (event, inbox_offset) VALUES ($1, $2)`, string(ev), m.Offset)
		return err
	}
	p.h, err = inboxsarama.NewHandler(db.Pool, ib, fn, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{RetryBackoff: 20 * time.Millisecond, DrainTimeout: 50 * time.Millisecond}})
	require.NoError(t, err)
	cfg := kafkatest.Config()
	cfg.Consumer.Group.Session.Timeout = 2 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	cfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	cg, err := sarama.NewConsumerGroup(addrs, "payments-svc", cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = cg.Consume(ctx, []string{"payments.v1"}, p.h) // returns at each rebalance
		}
	}()
	t.Cleanup(func() { cancel(); <-done; _ = cg.Close() })
	return p
}

func startRelay(t *testing.T, db *testdb.DB, addrs []string) *relay.Relay {
	t.Helper()
	kc := kafkatest.Config()
	kc.Producer.Idempotent = true
	kc.Producer.RequiredAcks = sarama.WaitForAll
	kc.Net.MaxOpenRequests = 1
	kc.Producer.Return.Successes = true
	r, err := relay.New(relay.Config{Pool: db.Pool, Brokers: addrs, Kafka: kc, Lanes: 4, Channel: "pgbox_" + db.Schema,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return r
}

func produce(t *testing.T, addrs []string, events ...string) {
	t.Helper()
	cfg := kafkatest.Config()
	cfg.Producer.Return.Successes = true
	p, err := sarama.NewSyncProducer(addrs, cfg)
	require.NoError(t, err)
	defer p.Close()
	for _, ev := range events {
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "payments.v1", Key: sarama.StringEncoder(ev),
			Value:   sarama.StringEncoder(`{"charge": "` + ev + `", "amount": 1250, "currency": "XTS"}`),
			Headers: []sarama.RecordHeader{{Key: []byte("event-id"), Value: []byte(ev)}}})
		require.NoError(t, err)
	}
}

// TestBrowser is an operator's visit in a real browser: log in, read the
// overview, find a dead letter by its key, replay it (the replay reaches
// Kafka and the consumer processes it exactly once), then discard a parked
// row and see it gone; "replay again" pressed by two operators at once
// replays once; 1,000 parked rows at the head of a large backlog are
// listed, confirmed and retried. Under make screenshots it refreshes docs/console-*.png.
func TestBrowser(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	kc := kafkatest.New(t, kfake.SeedTopics(1, "payments.v1", "payments.v1.dlq"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	addrs := kc.ListenAddrs()
	r := startRelay(t, db, addrs)
	pay := startPayments(t, db, addrs)

	// pay-2 fails: dead-lettered. pay-1 and pay-3 are charged.
	pay.broken.Store("pay-2", true)
	produce(t, addrs, "pay-1", "pay-2", "pay-3")
	testutil.Eventually(t, time.Minute, "pay-2 dead-lettered, the others charged", func() bool {
		return scalar[int](t, db, `SELECT count(*) FROM pgbox_consumer_dead`) == 1 && scalar[int](t, db, `SELECT count(*) FROM charges`) == 2
	})
	parked := parkRow(t, db, "ledger.v1", "entry-77", `{"entry": 77}`, "kafka: MESSAGE_TOO_LARGE (record 1.4 MB > 1 MB)")
	seedHistory(t, db)
	pay.broken.Delete("pay-2") // the fix is deployed

	admin, err := sarama.NewClusterAdmin(addrs, kafkatest.Config())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	cfg := console.Config{DB: db.Pool, Auth: testAuth(t), Published: func() uint64 { return r.Stats().Published },
		Inspect: inspect.Config{Lanes: 4, Cutoffs: &cleanup.CutoffsConfig{Admin: cleanupsarama.New(admin)}}}
	h, err := console.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx := browser(t, "otto", operatorPass)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }

	steps(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#warnings")))
	shot(t, ctx, "console-overview")
	require.Contains(t, text(t, ctx, "#warnings"), "parked rows hold back their keys")
	require.Contains(t, text(t, ctx, "#deadcounts"), "payments.v1")

	// Find the dead letter by its key and replay it.
	steps(t, ctx,
		chromedp.Navigate(srv.URL+"/dead"),
		chromedp.SendKeys(css("#dead-key"), "pay-2"),
		chromedp.Click(css("#dead-find")),
		// The value attribute is the server's: the filtered page has loaded.
		chromedp.WaitVisible(css(`#dead-key[value="pay-2"]`)),
		chromedp.WaitVisible(css("#dead")),
		chromedp.Click(css("#dead tbody a")),
		chromedp.WaitVisible(css("#replay")),
	)
	shot(t, ctx, "console-dead-letter")
	steps(t, ctx, chromedp.Click(css("#replay")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, ctx, "#flash"), "dead.replay by otto: ok (1 of 1 row)")

	// The replay reaches Kafka and is charged exactly once.
	testutil.Eventually(t, time.Minute, "the replay charged", func() bool {
		return scalar[int](t, db, `SELECT count(*) FROM charges WHERE event = 'pay-2'`) == 1
	})
	recs := kafkatest.ReadAll(t, addrs, "payments.v1", 4, time.Minute)
	var replays int
	for _, m := range recs {
		for _, hd := range m.Headers {
			if string(hd.Key) == inbox.ReplayHeader {
				replays++
				require.Equal(t, "pay-2", string(m.Key))
			}
		}
	}
	require.Equal(t, 1, replays, "one replay record on payments.v1")
	testutil.Eventually(t, time.Minute, "the consumer saw every record", func() bool {
		return scalar[int](t, db, `SELECT count(*) FROM pgbox_inbox WHERE consumer = 'payments-svc'`) == 4
	})
	require.Equal(t, 3, scalar[int](t, db, `SELECT count(*) FROM charges`), "pay-1, pay-3, and the replay of pay-2: once each")

	// The key's story shows the dead letter, its replay's inbox key.
	steps(t, ctx, chromedp.Navigate(srv.URL+"/story?topic=payments.v1&key=pay-2"), chromedp.WaitVisible(css("#story-dead")))
	shot(t, ctx, "console-story")
	require.Contains(t, text(t, ctx, "#story-inbox"), "pay-2/replay/")

	// Discard the parked row.
	steps(t, ctx,
		chromedp.Navigate(srv.URL+"/parked"),
		chromedp.Click(css(fmt.Sprintf(`a[href$="/parked/row?id=%d"]`, parked))),
		chromedp.WaitVisible(css("#discard")),
	)
	shot(t, ctx, "console-parked-row")
	steps(t, ctx, chromedp.Click(css("#discard")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, ctx, "#flash"), "parked.discard by otto: ok (1 of 1 row)")
	require.Contains(t, text(t, ctx, "main"), "No parked rows match")
	_, err = inspect.ReadOutboxRow(context.Background(), db.Pool, parked)
	require.ErrorIs(t, err, inspect.ErrRowNotFound)

	// A bulk discard (items 1 and 13 of issue 27): the confirmation lists
	// the rows, with a cancel link; a row discarded elsewhere and a new one
	// parked before "Yes" make the action refuse, touching nothing.
	var nope []int64
	for i := range 3 {
		nope = append(nope, parkRow(t, db, "nope.v1", fmt.Sprintf("order-%d", i), `{}`, "kafka: UNKNOWN_TOPIC_OR_PARTITION"))
	}
	steps(t, ctx,
		chromedp.Navigate(srv.URL+"/parked?topic=nope.v1"),
		chromedp.Click(css("#discard-all")),
		chromedp.WaitVisible(css("#confirm-rows")),
	)
	shot(t, ctx, "console-confirm")
	require.Contains(t, text(t, ctx, "#confirm"), "Yes, discard 3 rows")
	require.Contains(t, text(t, ctx, "#confirm-rows"), "nope.v1 order-1")
	steps(t, ctx, chromedp.WaitVisible(css("#cancel")))
	exec(t, db, `DELETE FROM pgbox_outbox WHERE id = $1`, nope[2])
	late := parkRow(t, db, "nope.v1", "order-late", `{}`, "kafka: UNKNOWN_TOPIC_OR_PARTITION")
	steps(t, ctx, chromedp.Click(css("#confirm")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, ctx, "#flash"), "refused: the rows changed since the confirmation")
	require.Equal(t, 3, scalar[int](t, db, `SELECT count(*) FROM pgbox_outbox WHERE topic = 'nope.v1'`), "nothing discarded")
	require.Equal(t, 1, scalar[int](t, db, `SELECT count(*) FROM pgbox_outbox WHERE id = $1`, late))
	// Confirmed again, with the rows as they are now: one row is "1 row".
	steps(t, ctx,
		chromedp.Navigate(srv.URL+"/parked/confirm?action=retry&ids="+fmt.Sprint(late)),
		chromedp.WaitVisible(css("#confirm")),
	)
	require.Contains(t, text(t, ctx, "#confirm"), "Yes, retry 1 row")
	require.NotContains(t, text(t, ctx, "#confirm"), "rows")

	steps(t, ctx, chromedp.Navigate(srv.URL+"/audit"), chromedp.WaitVisible(css("#audit")))
	shot(t, ctx, "console-audit")
	audit := text(t, ctx, "#audit")
	require.Contains(t, audit, "dead.replay")
	require.Contains(t, audit, "parked.discard")

	// A viewer's confirmation page has no button.
	vera := browser(t, "vera", viewerPass)
	steps(t, vera, chromedp.Navigate(srv.URL+"/parked/confirm?action=discard&topic=nope.v1"), chromedp.WaitVisible(css("#viewer-note")))
	buttons, err := chromedp.Run(vera, chromedp.Nodes(css("#confirm"), chromedp.AtLeast(0)))
	require.NoError(t, err)
	require.Empty(t, buttons, "a viewer gets no Yes button")

	// Kafka hanging (item 6): the overview renders its database sections
	// and says Kafka is not answering; it does not fail.
	hang := cfg
	hang.Inspect.Cutoffs = hangingAdmin(t)
	hang.KafkaWait = 500 * time.Millisecond
	hung, err := console.New(hang)
	require.NoError(t, err)
	hsrv := httptest.NewServer(hung)
	t.Cleanup(hsrv.Close)
	steps(t, ctx, chromedp.Navigate(hsrv.URL+"/"), chromedp.WaitVisible(css("#kafka-down")), chromedp.WaitVisible(css("#instances")))
	require.Contains(t, text(t, ctx, "#kafka-down"), "Kafka is not answering")
	require.Contains(t, text(t, ctx, "#parkedcounts"), "nope.v1")

	// Issue 33 (browser_round3_test.go).
	t.Run("replay again by two operators", func(t *testing.T) { browseReplayAgainTwice(t, ctx, srv.URL, db) })
	t.Run("parked rows at the head of a backlog", func(t *testing.T) { browseParkedAtHead(t, ctx) })
	t.Run("injected audit content", func(t *testing.T) { browseInjectedAudit(t, db, srv.URL, ctx, vera) })
}

// browseInjectedAudit is issue 33 item 10 through the page: a failed
// login's chosen name is no banner on anyone's page and shows on the audit
// page as a quoted claim; another person's action, or an action on other
// rows, is no flash; made-up form fields are not in the audit's target.
// otto and vera are their browsers.
func browseInjectedAudit(t *testing.T, db *testdb.DB, url string, otto, vera context.Context) {
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	noFlash := func(ctx context.Context, path, why string) {
		t.Helper()
		steps(t, ctx, chromedp.Navigate(url+path), chromedp.WaitVisible(css("h1")))
		flash, err := chromedp.Run(ctx, chromedp.Nodes(css("#flash"), chromedp.AtLeast(0)))
		require.NoError(t, err)
		require.Empty(t, flash, why)
	}
	lure := "URGENT — console moved, re-enter your password at console.example.net/login"
	req, err := http.NewRequest("GET", url+"/", nil)
	require.NoError(t, err)
	req.SetBasicAuth(lure, "x")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	lureID := scalar[int64](t, db, `SELECT id FROM pgbox_console_audit WHERE actor = $1`, lure)
	noFlash(otto, fmt.Sprintf("/dead?done=%d", lureID), "a failed login is no banner")
	discard := scalar[int64](t, db, `SELECT max(id) FROM pgbox_console_audit WHERE action = 'parked.discard' AND actor = 'otto'`)
	noFlash(vera, fmt.Sprintf("/parked?done=%d", discard), "otto's action is not vera's flash")
	noFlash(otto, fmt.Sprintf("/dead?done=%d", discard), "a discard is not the dead-letter page's flash")

	// A discard whose form carries a made-up field named like a target.
	p := parkRow(t, db, "forged.v1", "f-1", "{}", "boom")
	steps(t, otto,
		chromedp.Navigate(fmt.Sprintf("%s/parked/confirm?action=discard&ids=%d", url, p)),
		chromedp.WaitVisible(css("#confirm")),
	)
	added, err := chromedp.Run(otto, chromedp.Evaluate[bool](`(() => { const i = document.createElement("input"); i.type = "hidden";
		i.name = 'topic="nosuchtopic" note'; i.value = "x"; document.querySelector("form[method=post]").appendChild(i); return true })()`))
	require.NoError(t, err)
	require.True(t, added)
	steps(t, otto, chromedp.Click(css("#confirm")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, otto, "#flash"), "parked.discard by otto: ok (1 of 1 row)", "the operator's own action is shown")
	steps(t, otto, chromedp.Navigate(url+"/audit"), chromedp.WaitVisible(css("#audit")))
	audit := text(t, otto, "#audit")
	require.Contains(t, audit, `claimed "URGENT — console moved`, "the name is shown as a quoted claim")
	require.Contains(t, audit, fmt.Sprintf(`confirmed="%d" ids="%d"`, p, p))
	require.NotContains(t, audit, "nosuchtopic", "a made-up field is not in the target")
}

// seedHistory writes an hour of history samples for the chart, as a relay's
// heartbeat records them (relay.recordHistory: every 10 s, the backlog per
// topic and what the instance published since): a backlog that built up
// and drained on payments.v1 while ledger.v1 ran steadily.
func seedHistory(t *testing.T, db *testdb.DB) {
	t.Helper()
	exec(t, db, `INSERT INTO pgbox_relay_history (at, topic, backlog, published)
		SELECT now() - s * interval '10 seconds', t.topic,
			CASE t.topic WHEN 'payments.v1' THEN greatest(0, 4000 - abs(s - 200) * 40) WHEN 'ledger.v1' THEN 40 + (s % 7) * 3 ELSE 0 END,
			CASE t.topic WHEN 'payments.v1' THEN 300 + (s % 11) * 20 WHEN 'ledger.v1' THEN 100 + (s % 5) * 10 ELSE 0 END
		FROM generate_series(0, 359) s, (VALUES (''), ('payments.v1'), ('ledger.v1')) AS t(topic)`)
}
