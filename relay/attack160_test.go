package relay_test

// Review of 00160 (the claim asks whether a keyed row is parked in its
// claiming statement's snapshot): rows parked from outside the relay while
// it runs, by a script's UPDATE (often of a row the relay has claimed and
// is sending) and by a writer that inserts rows parked, while an operator
// retries every parked row.

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/migrations"
)

// writeCountedParked is writeCounted by another language's writer that
// inserts its row parked (a validation it failed): the key's later rows
// wait behind it until an operator retries it.
func writeCountedParked(ctx context.Context, b *testBundle, key string) error {
	return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n`, key).Scan(&n); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO pgbox_outbox (topic, key, value, parked_at, last_error)
			VALUES ($1, convert_to($2, 'UTF8'), convert_to($3, 'UTF8'), now(), 'parked by its writer')`, b.topic, key, strconv.Itoa(n))
		return err
	})
}

// Counted writers (outbox.Write, and one that inserts every third row
// parked) on a few keys; a script parks a random unparked row of the
// topic every few milliseconds (the newest ones too: rows the relay has
// claimed and is sending); an operator retries every parked row every
// 100 ms. Every event arrives, each key in commit order, no duplicate.
func TestAttack160ScriptAndWriterParkWhileRelayRuns(t *testing.T) {
	t.Parallel()
	parkWhileRelayRuns(t)
}

func parkWhileRelayRuns(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	const keys = 6
	createCounters(t, b, keys)
	cfg := b.config("a")
	cfg.BatchSize = 16
	start(t, cfg)
	stop, written, wg := startWriters(ctx, t, b, keys, 160)
	wg.Go(func() { // a writer that inserts some rows parked
		rng := rand.New(rand.NewPCG(160, 1))
		for i := 0; !stop.Load(); i++ {
			w := writeCounted
			if i%3 == 0 {
				w = writeCountedParked
			}
			if err := w(ctx, b, keyed(rng.IntN(keys))); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	})
	var scripted atomic.Int64
	wg.Go(func() { // a script that parks rows, newest first half the time
		for i := 0; !stop.Load(); i++ {
			order := "random()"
			if i%2 == 0 {
				order = "id DESC"
			}
			tag, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now(), last_error = 'parked by a script'
				WHERE id = (SELECT id FROM pgbox_outbox WHERE topic = $1 AND parked_at IS NULL ORDER BY `+order+` LIMIT 1)`, b.topic)
			if err != nil {
				t.Error(err)
				return
			}
			scripted.Add(tag.RowsAffected())
			time.Sleep(3 * time.Millisecond)
		}
	})
	retried := retryParkedRounds(ctx, t, b, 25)
	stop.Store(true)
	wg.Wait()
	retried += retryParkedUntilNone(ctx, t, b)
	t.Logf("%d written, %d parked by the script, %d retried", written.Load(), scripted.Load(), retried)
	require.Positive(t, scripted.Load())
	checkAllArrived(t, b, int(written.Load()), 0, "none")
}

// The newest migration rolled back and applied again, over and over
// (migrations' Down and Up, as `relay migrate down --force` and `relay
// migrate up` would), beneath a running relay and writers. Written for
// 00160, whose swaps switch the claims between 00140's body and 00160's
// mid-run (the signature is the same); with 00170 the writers' trigger
// functions switch between 00120's bodies and 00170's, and no writer may
// fail for it (00170's Down drops nothing they use). The rows parked are the
// relay's own (a topic that does not exist yet, then an operator's
// retries, as TestAttack150RetryParkedRacesClaimsOverDeadRows). Parking
// from outside the relay is 00140's race, which each Down brings back: a
// variant with TestAttack160ScriptAndWriterParkWhileRelayRuns's script and
// writer lost a key's order once in 13 runs (7 under -race; never in 14
// runs steadily on 00150 nor in 9 on 00160; presumably every claim recompiled
// after a swap plans its row statement between its question and its rows,
// which widens the window). Every event arrives, each key
// in commit order, no duplicate, and the schema ends at the newest migration.
func TestAttack160DownUpUnderRunningRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.topic = "late" // the counted writers' and checkAllArrived's topic
	const keys = 6
	createCounters(t, b, keys)
	cfg := b.config("a")
	cfg.BatchSize = 16
	cfg.UnknownTopicWindow = 300 * time.Millisecond
	start(t, cfg)
	p, err := migrations.NewProvider(b.db.SQL(t), migrations.Config{})
	require.NoError(t, err)
	stop, written, wg := startWriters(ctx, t, b, keys, 1600)
	var swaps atomic.Int64
	wg.Go(func() {
		for !stop.Load() {
			if _, err := p.Down(ctx); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
			if _, err := p.Up(ctx); err != nil {
				t.Error(err)
				return
			}
			swaps.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
	})
	waitFor(t, "rows parked", func() bool { return b.outboxCount(t, "parked_at IS NOT NULL") >= keys/2 })
	kafkatest.CreateTopic(t, b.addrs, "late", 3, nil)
	retried := retryParkedRounds(ctx, t, b, 8)
	stop.Store(true)
	wg.Wait()
	retried += retryParkedUntilNone(ctx, t, b)
	var v int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT max(version_id) FROM pgbox_migrations`).Scan(&v))
	require.EqualValues(t, 170, v, "the schema ends at 00170")
	t.Logf("%d written, %d retried, the last migration down and up %d times", written.Load(), retried, swaps.Load())
	require.Positive(t, retried)
	require.Positive(t, swaps.Load())
	checkAllArrived(t, b, int(written.Load()), 0, "none")
}

// A parked row's key is cleared by hand (as TestClaimSeesParkedRowsInItsOwnSnapshot's
// setup does; or its key or topic "fixed"): the later row of its old key
// it held is free. No rewind is written (00120's triggers fire on
// parked_at going NULL and on DELETE only), and the floor had passed the
// held row, so it waits for the sweep (SweepInterval, a minute by default),
// which publishes it and reports it as a hole in the floor's rule (an
// ERROR asking to report it, RowsBelowFloor, the PgboxRelayRowsBelowFloor
// alert), though the rule held. Here: the held row arrives, the parked
// row stays parked; what the sweep counted is logged.
func TestAttack160ParkedRowKeyClearedReleasesHeldRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config("a")
	cfg.SweepInterval = 2 * time.Second
	rr := start(t, cfg)
	for _, q := range []string{
		`INSERT INTO pgbox_outbox (topic, key, value, parked_at) VALUES ('events', 'k', 'parked', now())`,
		`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('events', 'k', 'held')`,
		// More than 64 ids after them: the floors may pass them (seq_hw).
		`INSERT INTO pgbox_outbox (topic, key, value) SELECT 'events', convert_to('o' || g, 'UTF8'), 'other' FROM generate_series(1, 300) g`,
	} {
		_, err := b.db.Pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	waitFor(t, "the other rows published", func() bool { return b.outboxCount(t, "value = 'other'") == 0 })
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, b.outboxCount(t, "value = 'held'"), "held behind its key's parked row")
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET key = NULL WHERE value = 'parked'`)
	require.NoError(t, err)
	t0 := time.Now()
	waitFor(t, "the held row published", func() bool { return b.outboxCount(t, "value = 'held'") == 0 })
	require.Equal(t, 1, b.outboxCount(t, "value = 'parked' AND parked_at IS NOT NULL"), "the parked row stays parked")
	t.Logf("the held row went out %v after its parked row's key was cleared; rows below floor counted: %d",
		time.Since(t0).Round(time.Millisecond), rr.r.Stats().RowsBelowFloor)
}
