package console_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// TestBrowser's visits for issue 33, each its own subtest.

// browseReplayAgainTwice (item 2): two operators open the confirmation of
// "replay again" for dead letter pay-2 (replayed once) and both press
// "Yes": the first replays it, the second is refused because the replay
// count it confirmed changed; the count goes 1 → 2, and the consumer
// processes the second replay once.
func browseReplayAgainTwice(t *testing.T, otto context.Context, url string, db *testdb.DB) {
	other := browser(t, "otto", operatorPass)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	confirm := url + "/dead/confirm?again=1&key=pay-2"
	for _, ctx := range []context.Context{otto, other} {
		steps(t, ctx, chromedp.Navigate(confirm), chromedp.WaitVisible(css("#confirm")))
		require.Equal(t, "1", text(t, ctx, "#confirm-rows td.state"), "the confirmation shows the current replay count")
	}
	steps(t, otto, chromedp.Click(css("#confirm")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, otto, "#flash"), "dead.replay_again by otto: ok (1 of 1 row)")
	steps(t, other, chromedp.Click(css("#confirm")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, other, "#flash"), "refused: the replay counts changed since the confirmation")
	require.Equal(t, 2, scalar[int](t, db, `SELECT replays FROM pgbox_consumer_dead WHERE key = 'pay-2'`))
	testutil.Eventually(t, time.Minute, "the second replay charged", func() bool {
		return scalar[int](t, db, `SELECT count(*) FROM charges WHERE event = 'pay-2'`) == 2
	})
}

// browseParkedAtHead (item 1): 1,000 parked rows at the head of a
// 100,000-row backlog (in 5 slots: 20,000 rows behind each, as a
// 5,000,000-row backlog has): the overview, the parked list, the
// confirmation of retrying all 1,000 and the retry itself, within the
// console's time limit (2 s here; each held count walked its slot, and the
// confirmation ran out of time).
func browseParkedAtHead(t *testing.T, ctx context.Context) {
	db := testdb.New(t)
	seedParkedAtHead(t, db, 1000, 100_000)
	h, err := console.New(console.Config{DB: db.Pool, Auth: testAuth(t), QueryTimeout: 2 * time.Second})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	steps(t, ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#parkedcounts")))
	require.Contains(t, text(t, ctx, "#parkedcounts"), "≥ 1,000")
	steps(t, ctx,
		chromedp.Navigate(srv.URL+"/parked?topic=head.v1"),
		chromedp.WaitVisible(css("#parked-count")),
	)
	require.Equal(t, "1,000", text(t, ctx, "#parked-count"))
	steps(t, ctx, chromedp.Click(css("#retry-all")), chromedp.WaitVisible(css("#confirm-rows")))
	require.Equal(t, "1000", text(t, ctx, "#confirm-count"))
	steps(t, ctx, chromedp.Click(css("#confirm")), chromedp.WaitVisible(css("#flash")))
	require.Contains(t, text(t, ctx, "#flash"), "parked.retry by otto: ok")
	require.Equal(t, 0, scalar[int](t, db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`), "all 1,000 retried")
}
