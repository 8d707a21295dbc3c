package console_test

// Issue 33 (the console at production size, round three), items 1, 2, 5,
// 6, 7 and 12. Each test failed before its fix.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/testdb"
)

// headSlots is how many slots seedParkedAtHead fills: the rows of a few
// slots stand for a whole backlog's (a 1,000,000-row backlog over 256 slots
// is 3,900 rows per slot; 100,000 rows over 5 slots is 20,000).
const headSlots = 5

// seedParkedAtHead parks parked rows (keys p0, p1, …) at the head of a
// backlog of backlog rows, all in headSlots slots: every parked row is older
// than every row of its slot. Parked row p0 holds two later rows of its key.
func seedParkedAtHead(t *testing.T, db *testdb.DB, parked, backlog int) {
	t.Helper()
	exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, created_at, parked_at)
		SELECT gen_random_uuid(), g % $2, 'head.v1', convert_to('p' || g, 'UTF8'), 'v', 5, 'MESSAGE_TOO_LARGE',
			now() - interval '2 hours', now() - interval '2 hours' + g * interval '1 millisecond'
		FROM generate_series(0, $1 - 1) g`, parked, headSlots)
	exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), 0, 'head.v1', 'p0', 'held' FROM generate_series(1, 2)`)
	exec(t, db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		SELECT gen_random_uuid(), g % $2, 'head.v1', convert_to('k' || g, 'UTF8'), 'v' FROM generate_series(1, $1) g`, backlog, headSlots)
	exec(t, db, `ANALYZE pgbox_outbox`)
}

// TestParkedAtHeadOfBacklog (item 1): 1,000 parked rows at the head of a
// large backlog. Each one's "held" count walked every later row of its
// slot: the parked page, the confirmation of a bulk retry (1,001 rows) and
// the overview ran past their time limits. Now the pages count nothing they
// do not show, and a snapshot (relay status) reads a bounded number of rows
// per parked row, marking a count that stopped as a lower bound.
func TestParkedAtHeadOfBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) {
		c.QueryTimeout = 2 * time.Second
		c.Inspect.StatementTimeout = 500 * time.Millisecond
	})
	seedParkedAtHead(t, b.db, 1000, 100_000)
	otto := b.as("otto", operatorPass)

	start := time.Now()
	over := otto.get(t, "/")
	require.Contains(t, over, "≥ 1,000 parked rows hold back their keys")
	list := otto.get(t, "/parked?topic=head.v1")
	require.Contains(t, list, `<span id="parked-count">1,000</span> parked rows match`)
	form := otto.confirmForm(t, "/parked/confirm?action=retry&topic=head.v1")
	require.Len(t, strings.Split(form.Get("confirmed"), ","), 1000)
	code, _, hdr := otto.do(t, "POST", "/parked/retry", form)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, otto.get(t, hdr.Get("Location")), "parked.retry by otto: ok (")
	require.Equal(t, 0, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox WHERE parked_at IS NOT NULL`), "all 1,000 retried")
	t.Logf("overview, parked page, confirmation and retry of 1,000 parked rows at the head of 100,000: %v", time.Since(start))

	// relay status: the snapshot's held counts are bounded and say so.
	exec(t, b.db, `UPDATE pgbox_outbox SET parked_at = now() - interval '1 hour' WHERE key LIKE 'p%' AND value = 'v'`)
	snap, err := inspect.Read(context.Background(), b.db.Pool, inspect.Config{StatementTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, snap.Parked, inspect.ParkedListDefault)
	for _, p := range snap.Parked {
		require.True(t, p.HeldCapped, "row %d: its slot has 20,000 later rows", p.ID)
	}
	var text bytes.Buffer
	snap.WriteText(&text)
	require.Contains(t, text.String(), ">=0")
	require.Contains(t, text.String(), "HELD >=n: at least n")
	// p0, at the head of slot 0, with its two held rows right behind it.
	p0, err := inspect.ListParked(context.Background(), b.db.Pool, inspect.ParkedFilter{Key: []byte("p0")})
	require.NoError(t, err)
	require.Len(t, p0, 1)
	require.EqualValues(t, 2, p0[0].Held)
	require.True(t, p0[0].HeldCapped)
}

// TestReplayAgainRunsOnce (item 2): two "replay again" forms confirmed
// from the same page (a double submit, or two operators): the first
// replays, the second is refused (audited) because the replay count it
// confirmed has changed; the count goes 1 → 2, not 1 → 3. The confirmation
// shows the current counts.
func TestReplayAgainRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d := deadRow(t, b.db, "orders.v1", "ord-1", "payload", 7)
	_, err := inspect.ReplayDead(context.Background(), b.db.Pool, []int64{d}, inspect.ReplayConfig{})
	require.NoError(t, err)
	otto := b.as("otto", operatorPass)
	page := otto.get(t, "/dead/confirm?again=1&ids="+fmt.Sprint(d))
	require.Contains(t, page, `<th class="n">Replays</th>`)
	require.Contains(t, page, `<td class="n state">1</td>`)
	first, second := formOf(t, page), formOf(t, page)
	code, _, _ := otto.do(t, "POST", "/dead/replay", first)
	require.Equal(t, http.StatusSeeOther, code)
	code, _, hdr := otto.do(t, "POST", "/dead/replay", second)
	require.Equal(t, http.StatusSeeOther, code)
	require.Contains(t, otto.get(t, hdr.Get("Location")), "refused: the replay counts changed since the confirmation")
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT replays FROM pgbox_consumer_dead WHERE id = $1`, d))
	require.Equal(t, 2, scalar[int](t, b.db, `SELECT count(*) FROM pgbox_outbox`), "two replays written, not three")
	recs, err := console.ReadAudit(context.Background(), b.db.Pool, 2)
	require.NoError(t, err)
	require.Equal(t, "dead.replay_again", recs[0].Action)
	require.Contains(t, recs[0].Result, "refused: the replay counts changed")
	require.Equal(t, "ok", recs[1].Result)

	// The row page's button carries the count it shows, too.
	row := otto.get(t, "/dead/row?id="+fmt.Sprint(d))
	stale := formOf(t, row)
	code, _, _ = otto.do(t, "POST", "/dead/replay", formOf(t, row))
	require.Equal(t, http.StatusSeeOther, code)
	code, _, _ = otto.do(t, "POST", "/dead/replay", stale)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT replays FROM pgbox_consumer_dead WHERE id = $1`, d))

	// Two submits that pass the page's check at once replay once: the
	// count is checked again under the row's lock.
	_, err = inspect.ReplayDead(context.Background(), b.db.Pool, []int64{d}, inspect.ReplayConfig{Again: true, Replays: map[int64]int{d: 2}})
	require.ErrorIs(t, err, inspect.ErrReplaysChanged)
	require.Equal(t, 3, scalar[int](t, b.db, `SELECT replays FROM pgbox_consumer_dead WHERE id = $1`, d))
}

// TestHiddenPayloadFiltersNeedOperator (item 5): with payloads hidden, a
// viewer's filters over hidden text (a key, an error text) and a key's
// story are refused: the error filter read a hidden card number digit by
// digit, the key filter confirmed that an exact key exists. An operator
// keeps them, and the audit trail records what they typed as hidden; the
// story by event id stays open.
func TestHiddenPayloadFiltersNeedOperator(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.HidePayloads = true })
	exec(t, b.db, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic)
		VALUES ('svc', 'cards.v1', 0, 1, 'card-4111', 3, 'inbox: consumer "svc", message cards.v1/0@1: handler: card 4111111111111111 declined', 'cards.v1.dlq')`)
	parkRow(t, b.db, "cards.v1", "card-4111", `{}`, `kafka: record "card-4111" rejected`)
	vera, otto := b.as("vera", viewerPass), b.as("otto", operatorPass)
	for _, path := range []string{
		"/dead?error=" + url.QueryEscape("card 4"),
		"/dead?key=card-4111",
		"/dead/confirm?key=card-4111",
		"/dead/confirm?error=4111",
		"/parked?key=card-4111",
		"/parked?error=card-4",
		"/parked/confirm?action=retry&key=card-4111",
		"/story?topic=cards.v1&key=card-4111",
	} {
		code, body, _ := vera.do(t, "GET", path, nil)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, body, "needs the operator role while payloads are hidden", path)
		require.NotContains(t, otto.get(t, path), "needs the operator role", path)
	}
	vera.get(t, "/dead?consumer=svc&topic=cards.v1")
	vera.get(t, "/story?event=0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")

	// What an operator typed is hidden from the audit trail, which viewers read.
	code, _, _ := otto.do(t, "POST", "/parked/discard", otto.confirmForm(t, "/parked/confirm?action=discard&error=card-4111"))
	require.Equal(t, http.StatusSeeOther, code)
	audit := vera.get(t, "/audit")
	require.Contains(t, audit, "parked.discard")
	require.NotContains(t, audit, "card-4111")
}

// TestFiltersApplyAllConditionsBeforeTheLimit (item 6): a consumer's dead
// letters matching an error text, or a key, come after more than the limit
// of other consumers' matches; parked rows of a key on one topic after
// more than the limit on another. Each filter finds them all.
func TestFiltersApplyAllConditionsBeforeTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.MaxActionRows = 50 })
	exec(t, b.db, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic, record_stored, record_key, record_value)
		SELECT CASE WHEN g <= 1005 THEN 'c-a' ELSE 'c-b' END, 'orders.v1', 0, g, 'k', 3, 'poison pill', 'orders.v1.dlq', true, 'k', 'v'
		FROM generate_series(1, 1008) g`)
	exec(t, b.db, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value, attempts, last_error, parked_at)
		SELECT gen_random_uuid(), 0, CASE WHEN g <= 1005 THEN 'a.v1' ELSE 'b.v1' END, 'k', 'v', 5, 'boom', now()
		FROM generate_series(1, 1008) g`)
	otto := b.as("otto", operatorPass)
	for _, path := range []string{"/dead?consumer=c-b&error=poison", "/dead?consumer=c-b&key=k", "/dead?consumer=c-b&key=k&error=pill"} {
		page := otto.get(t, path)
		require.Equal(t, 3, strings.Count(page, "/dead/row?id="), path)
	}
	page := otto.get(t, "/parked?topic=b.v1&key=k")
	require.Contains(t, page, `<span id="parked-count">3</span> parked rows match`)
	require.Equal(t, 3, strings.Count(page, "/parked/row?id="))
	for _, path := range []string{"/dead/confirm?consumer=c-b&error=poison", "/parked/confirm?action=discard&topic=b.v1&key=k"} {
		require.Len(t, strings.Split(otto.confirmForm(t, path).Get("confirmed"), ","), 3, path)
	}
}

// TestDeadCountsPerConsumer (item 7): 1,019 dead letters of one consumer,
// then 3 of another. The counts came from the first 1,000 rows of the
// table: the second consumer was missing, and relay status printed a
// count with no cap marker. Every consumer and topic is counted, exactly
// or marked capped.
func TestDeadCountsPerConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exec(t, b.db, `INSERT INTO pgbox_consumer_dead (consumer, topic, partition, "offset", key, attempts, error, dlq_topic)
		SELECT CASE WHEN g <= 1019 THEN 'c-a' ELSE 'c-b' END, 'orders.v1', 0, g, 'k' || g, 3, 'poison', 'orders.v1.dlq'
		FROM generate_series(1, 1022) g`)
	over := b.as("vera", viewerPass).get(t, "/")
	require.Regexp(t, `c-a</td><td><a [^>]+>orders.v1</a></td><td class="n">≥ 1,000</td>`, over)
	require.Regexp(t, `c-b</td><td><a [^>]+>orders.v1</a></td><td class="n">3</td>`, over)

	snap, err := inspect.Read(context.Background(), b.db.Pool, inspect.Config{})
	require.NoError(t, err)
	require.Equal(t, []inspect.DeadCount{{Consumer: "c-a", Topic: "orders.v1", Count: 1000, Capped: true},
		{Consumer: "c-b", Topic: "orders.v1", Count: 3}}, snap.Dead)
	var text bytes.Buffer
	snap.WriteText(&text)
	require.Regexp(t, `c-a\s+orders.v1\s+>=1000\n`, text.String())
	require.Regexp(t, `c-b\s+orders.v1\s+3\n`, text.String())
}

// TestInstanceStateWording (item 12): the overview and relay status say the
// same of a sleeping instance (the overview said "asleep (waits for a
// NOTIFY)", relay status "live"), and what a sleeping relay does: it polls,
// and a NOTIFY wakes it sooner.
func TestInstanceStateWording(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exec(t, b.db, `INSERT INTO pgbox_relay_instances (instance, expires_at, kafka_ready, sleeping) VALUES
		('relay-a', now() + interval '1 minute', true, true), ('relay-b', now() + interval '1 minute', true, false)`)
	snap, err := inspect.Read(context.Background(), b.db.Pool, inspect.Config{})
	require.NoError(t, err)
	var text bytes.Buffer
	snap.WriteText(&text)
	asleep := "live, asleep (found no rows lately: polls every poll interval, a NOTIFY wakes it sooner)"
	require.Contains(t, text.String(), asleep)
	require.Contains(t, text.String(), "live, awake")
	over := b.as("vera", viewerPass).get(t, "/")
	require.Contains(t, over, asleep)
	require.Contains(t, over, "live, awake")
}
