package relay_test

// Hostile review of a Fleet's idle poll and dormancy (relay/dormant.go,
// commit 8da2d29). Each test names what it attacks and what must hold:
// every committed row is published (duplicates allowed), one key's events
// arrive in commit order, and nothing is left behind at stop.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// daTenants is newTenants whose shared pool (the Fleets' pool) carries
// application_name app, so a test can terminate every connection of its
// Fleets (pg_terminate_backend) and nobody else's.
func daTenants(t *testing.T, n int, app string) *tenants {
	t.Helper()
	ts := newTenants(t, n)
	cfg, err := pgxpool.ParseConfig(ts.decoy.URL)
	require.NoError(t, err)
	cfg.MaxConns = 3
	if app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	ts.shared, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(ts.shared.Close)
	return ts
}

// daSettle waits up to 10 s for every target of fs to be dormant and
// logs when some are not: a target whose idle question was once answered
// slowly polls for itself, and does not go dormant, for emptyPause (5
// minutes; TestDormantAttackSlowAnswerEndsDormancy), which a loaded
// machine causes at random. The attack then runs on the targets as they
// are.
func daSettle(t *testing.T, fs ...*relay.Fleet) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !daAllDormant(fs...) {
		if time.Now().After(deadline) {
			for _, f := range fs {
				t.Logf("not every target dormant after 10 s: %+v", f.Targets())
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func daAllDormant(fs ...*relay.Fleet) bool {
	for _, f := range fs {
		for _, s := range f.Targets() {
			if !s.Dormant {
				return false
			}
		}
	}
	return true
}

// daWrite commits keys rows (key-000...) with value round to db's outbox,
// the way mode says: "notify" (outbox.Write with Notify), "write"
// (outbox.Write without), "insert" (a plain multi-row SQL INSERT, as
// another language writes) or "copy" (COPY).
func daWrite(t *testing.T, pool *pgxpool.Pool, topic string, keys, round int, mode string) {
	t.Helper()
	ctx := context.Background()
	val := strconv.Itoa(round)
	switch mode {
	case "notify", "write":
		w, err := outbox.NewWriter(outbox.Config{Notify: mode == "notify"})
		require.NoError(t, err)
		msgs := make([]outbox.Message, keys)
		for k := range msgs {
			msgs[k] = outbox.Message{Topic: topic, Key: []byte(keyed(k)), Value: []byte(val)}
		}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))
	case "insert":
		var sb strings.Builder
		sb.WriteString("INSERT INTO pgbox_outbox (topic, key, value) VALUES ")
		for k := range keys {
			if k > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "('%s', '%s'::bytea, '%s'::bytea)", topic, keyed(k), val)
		}
		_, err := pool.Exec(ctx, sb.String())
		require.NoError(t, err)
	case "copy":
		rows := make([][]any, keys)
		for k := range rows {
			rows[k] = []any{topic, []byte(keyed(k)), []byte(val)}
		}
		n, err := pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"topic", "key", "value"}, pgx.CopyFromRows(rows))
		require.NoError(t, err)
		require.EqualValues(t, keys, n)
	default:
		t.Fatalf("mode %q", mode)
	}
}

// daCheck reads topic until it holds want distinct (key, value) events or
// timeout passes, and checks that every key's values (rounds) arrive in
// increasing order, duplicates aside. It returns the distinct count.
func daCheck(t *testing.T, addrs []string, topic string, want int, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	read := want
	for {
		got := kafkatest.ReadAll(t, addrs, topic, read, time.Until(deadline))
		last := map[string]int{}
		seen := map[string]bool{}
		for _, m := range got {
			v, err := strconv.Atoi(string(m.Value))
			require.NoError(t, err, "value %q", m.Value)
			id := string(m.Key) + "/" + string(m.Value)
			if seen[id] {
				continue // a duplicate (at least once allows it)
			}
			seen[id] = true
			prev, ok := last[string(m.Key)]
			require.True(t, !ok || v > prev, "topic %s key %s: event %d arrived after %d", topic, m.Key, v, prev)
			last[string(m.Key)] = v
		}
		if len(seen) >= want || time.Now().After(deadline) {
			return len(seen)
		}
		read = len(got) + want - len(seen)
	}
}

// Attack 5 (and 1): two Fleet processes (two Fleets, separate Instance
// names) and a plain relay over the same targets; bursts of keyed rows
// come separated by gaps around DormantAfter, so targets go dormant while
// the other instances claim, wake while the others go dormant, and bursts
// land while a dormant target's lanes are cut and handed over. Half the
// bursts notify, half are plain SQL or COPY (no notification).
//
// Must hold: every event arrives, every key's events in round order.
func TestDormantAttackTwoFleetsBursts(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 2, "")
	fa, _ := dormantFleet(t, ts, "fleet-a")
	fb, _ := dormantFleet(t, ts, "fleet-b")
	cfg := ts.relayConfig("plain")
	cfg.Pool, cfg.Schema = ts.schemas[1].Pool, ts.schemas[1].Schema
	start(t, cfg)
	daSettle(t, fa, fb)

	const keys, rounds = 12, 24
	modes := []string{"notify", "insert", "copy", "write"}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 1; round <= rounds; round++ {
		for i, db := range ts.schemas {
			daWrite(t, db.Pool, topicOf(i), keys, round, modes[(round+i)%len(modes)])
		}
		switch round % 4 {
		case 0:
			daSettle(t, fa, fb)
		default:
			time.Sleep(time.Duration(150+rng.IntN(400)) * time.Millisecond)
		}
	}
	for i := range ts.schemas {
		n := daCheck(t, ts.addrs, topicOf(i), keys*rounds, 60*time.Second)
		require.Equal(t, keys*rounds, n, "topic %s: distinct events published; fleet a %+v, fleet b %+v", topicOf(i), fa.Targets(), fb.Targets())
	}
}

// Attack 2: writers that never notify (a plain SQL INSERT as another
// language would write, COPY) while every target is dormant, round after
// round.
//
// Must hold: every row is published, every key in order.
func TestDormantAttackSilentWriters(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 3, "")
	f, _ := dormantFleet(t, ts, "silent")
	const keys, rounds = 15, 6
	for round := 1; round <= rounds; round++ {
		daSettle(t, f)
		for i, db := range ts.schemas {
			mode := "insert"
			if (round+i)%2 == 0 {
				mode = "copy"
			}
			daWrite(t, db.Pool, topicOf(i), keys, round, mode)
		}
		for i := range ts.schemas {
			require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(i), keys*round, 20*time.Second),
				"round %d, topic %s: targets %+v", round, topicOf(i), f.Targets())
		}
	}
}

// Attack 3a: a writer transaction that took its ids before the target
// went dormant, and commits after rows with higher ids were published and
// the target's lanes were given up (its floors passed those ids).
//
// Must hold: its rows are published (by the idle poll: it does not
// notify), and a later round of the same keys after them.
func TestDormantAttackLongWriterAcrossDormancy(t *testing.T) {
	// Not parallel: its open writing transaction (an xid) would be the
	// oldest running one of the cluster for the floor tests running beside
	// it (TestFloorLongWriter watches its own long writer).
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "long")
	ctx := context.Background()
	const keys = 10
	// Round 1 of keys 0-9 is written by the long writer; keys 10-19 go out
	// meanwhile (rounds 1 and 2) with higher ids.
	long, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(ctx) }()
	msgs := make([]outbox.Message, keys)
	for k := range msgs {
		msgs[k] = outbox.Message{Topic: topicOf(0), Key: []byte(keyed(k)), Value: []byte("1")}
	}
	require.NoError(t, outbox.Write(ctx, long, msgs...))
	other := func(round int) {
		m := make([]outbox.Message, keys)
		for k := range m {
			m[k] = outbox.Message{Topic: topicOf(0), Key: []byte(keyed(keys + k)), Value: []byte(strconv.Itoa(round))}
		}
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, m...) }))
	}
	other(1)
	other(2)
	require.Equal(t, 2*keys, daCheck(t, ts.addrs, topicOf(0), 2*keys, 20*time.Second))
	daSettle(t, f)
	time.Sleep(1200 * time.Millisecond) // the cut lanes expire: a wake takes a new epoch
	require.NoError(t, long.Commit(ctx))
	require.Equal(t, 3*keys, daCheck(t, ts.addrs, topicOf(0), 3*keys, 20*time.Second), "the long writer's rows: targets %+v", f.Targets())
	daWrite(t, db.Pool, topicOf(0), keys, 2, "insert") // keys 0-9, round 2: after the long writer's
	require.Equal(t, 4*keys, daCheck(t, ts.addrs, topicOf(0), 4*keys, 20*time.Second))
}

// Attack 3b: the outbox's sequence goes back while the target is dormant
// (ALTER SEQUENCE RESTART, setval, TRUNCATE ... RESTART IDENTITY).
//
// Must hold: rows written after the reset are published, in order.
func TestDormantAttackSequenceResetWhileDormant(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "reset")
	ctx := context.Background()
	const keys = 10
	round := 0
	for _, reset := range []string{
		`SELECT setval(pg_get_serial_sequence('pgbox_outbox', 'id'), 1, false)`,
		`TRUNCATE pgbox_outbox RESTART IDENTITY`,
		`ALTER TABLE pgbox_outbox ALTER COLUMN id RESTART WITH 1`,
	} {
		round++
		daWrite(t, db.Pool, topicOf(0), keys, round, "write")
		require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(0), keys*round, 20*time.Second))
		daSettle(t, f)
		_, err := db.Pool.Exec(ctx, reset)
		require.NoError(t, err, reset)
		round++
		daWrite(t, db.Pool, topicOf(0), keys, round, "insert")
		require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(0), keys*round, 20*time.Second),
			"after %q while dormant: targets %+v", reset, f.Targets())
	}
}

// Attack 3c: every connection of the Fleet (its relays', the idle poll's,
// the LISTEN connection) is terminated while every target is dormant,
// several times.
//
// Must hold: rows written after it, with and without a notification, are
// published.
func TestDormantAttackConnectionsKilledWhileDormant(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("pgbox-dormant-kill-%d", rand.Int64())
	ts := daTenants(t, 2, app)
	f, _ := dormantFleet(t, ts, "killed")
	ctx := context.Background()
	const keys = 8
	for round := 1; round <= 4; round++ {
		daSettle(t, f)
		var killed int
		require.NoError(t, ts.decoy.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&killed))
		require.Positive(t, killed, "no connection of the Fleet found")
		for i, db := range ts.schemas {
			mode := "write"
			if round%2 == 0 {
				mode = "notify"
			}
			daWrite(t, db.Pool, topicOf(i), keys, round, mode)
		}
		for i := range ts.schemas {
			require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(i), keys*round, 20*time.Second),
				"round %d (killed %d connections), topic %s: targets %+v", round, killed, topicOf(i), f.Targets())
		}
	}
}

// daParked commits key's row "1" already parked and its rows "2" and "3",
// which the parked row holds back; it returns the parked row's id.
func daParked(t *testing.T, pool *pgxpool.Pool, topic, key string) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value, attempts, last_error, parked_at)
			VALUES ($1, $2, '1', 5, 'failed on purpose (test)', now()) RETURNING id`, topic, []byte(key)).Scan(&id); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, outbox.Message{Topic: topic, Key: []byte(key), Value: []byte("2")},
			outbox.Message{Topic: topic, Key: []byte(key), Value: []byte("3")})
	}))
	return id
}

// Attack 4: an operator retries a parked row (inspect.RetryParked, as the
// console and `relay parked retry` do) while the target is dormant, with
// a notifying write of the same key racing it, many times.
//
// Must hold: the key's events arrive 1, 2, 3, 4 (the retried row first).
func TestDormantAttackOperatorRetryRacesWake(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "retry")
	ctx := context.Background()
	const tries = 6
	for i := range tries {
		key := fmt.Sprintf("parked-%d", i)
		id := daParked(t, db.Pool, topicOf(0), key)
		daSettle(t, f)
		var wg sync.WaitGroup
		wg.Go(func() {
			time.Sleep(time.Duration(i*7) * time.Millisecond)
			n, err := inspect.RetryParked(ctx, db.Pool, inspect.ParkedFilter{IDs: []int64{id}})
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
		})
		wg.Go(func() {
			time.Sleep(time.Duration((tries-i)*7) * time.Millisecond)
			w, err := outbox.NewWriter(outbox.Config{Notify: true})
			require.NoError(t, err)
			require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				return w.Write(ctx, tx, outbox.Message{Topic: topicOf(0), Key: []byte(key), Value: []byte("4")})
			}))
		})
		wg.Wait()
		waitFor(t, "drained", func() bool { return count(t, db) == 0 })
	}
	got := kafkatest.ReadAll(t, ts.addrs, topicOf(0), 4*tries, 20*time.Second)
	byKey := map[string][]string{}
	seen := map[string]bool{}
	for _, m := range got {
		id := string(m.Key) + "/" + string(m.Value)
		if seen[id] {
			continue
		}
		seen[id] = true
		byKey[string(m.Key)] = append(byKey[string(m.Key)], string(m.Value))
	}
	for i := range tries {
		key := fmt.Sprintf("parked-%d", i)
		require.Equal(t, []string{"1", "2", "3", "4"}, byKey[key], "key %s", key)
	}
}

// Attack 4b (cost): a parked row holds its key's later rows back. They are
// unparked rows, so the idle poll's question (any unparked row?) says yes
// at every poll: the dormant target is woken, heartbeats, takes its lanes
// back, claims nothing (the rows are held), and goes dormant again after
// DormantAfter, for as long as the row stays parked (days, until an
// operator acts). With a second instance each round trip also moves half
// the lanes away and back.
//
// Must hold (the cost the change documents, TestFleetTargetsGoDormantAndWake):
// a dormant target whose outbox holds only rows a parked row holds back
// stays dormant: no write to the instance table for 1.5 s (ten heartbeat
// intervals of this configuration, five DormantAfters).
func TestDormantAttackParkedKeyKeepsWaking(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "held")
	daParked(t, db.Pool, topicOf(0), "held")
	time.Sleep(time.Second) // the write's own notification may wake it once (DormantAfter is 300 ms)
	daSettle(t, f)
	before := instanceVersion(t, db.Pool)
	var wakes int
	deadline := time.Now().Add(1500 * time.Millisecond)
	was := true
	for time.Now().Before(deadline) {
		d := faState(t, f, "t0").Dormant
		if was && !d {
			wakes++
		}
		was = d
		time.Sleep(5 * time.Millisecond)
	}
	after := instanceVersion(t, db.Pool)
	require.Equal(t, before, after, "a dormant target whose only rows are held by a parked row was woken %d times in 1.5 s (it takes its lanes back and gives them up again each time)", wakes)
}

// Attack 6: targets removed (SetTargets) while dormant and while waking,
// then the Fleet stopped while dormant.
//
// Must hold: SetTargets and Run return promptly; a removed or stopped
// target leaves no instance row and no owned lane.
func TestDormantAttackRemoveWhileDormantAndWaking(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 4, "")
	f, stop := dormantFleet(t, ts, "remove")
	ctx := context.Background()
	targets := func(keep ...int) []relay.Target {
		var out []relay.Target
		for _, i := range keep {
			out = append(out, relay.Target{Name: fmt.Sprintf("t%d", i), Pool: ts.shared, Schema: ts.schemas[i].Schema})
		}
		return out
	}
	clean := func(i int, when string) {
		t.Helper()
		var inst, owned int
		require.NoError(t, ts.schemas[i].Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgbox_relay_instances),
			(SELECT count(*) FROM pgbox_relay_lanes WHERE owner IS NOT NULL AND expires_at > now())`).Scan(&inst, &owned))
		require.Zero(t, inst, "%s: target %d left an instance row", when, i)
		require.Zero(t, owned, "%s: target %d left an owned lane", when, i)
	}
	daSettle(t, f)
	t0 := time.Now()
	require.NoError(t, f.SetTargets(targets(1, 2, 3)))
	require.Less(t, time.Since(t0), 3*time.Second, "removing a dormant target")
	clean(0, "removed while dormant")

	// While waking: a notifying write wakes t1, and it is removed at once.
	daSettle(t, f)
	daWrite(t, ts.schemas[1].Pool, topicOf(1), 5, 1, "notify")
	t0 = time.Now()
	require.NoError(t, f.SetTargets(targets(2, 3)))
	require.Less(t, time.Since(t0), 3*time.Second, "removing a waking target")
	clean(1, "removed while waking")

	// Woken by the idle poll, removed a little later (during its
	// heartbeat or claim).
	daSettle(t, f)
	daWrite(t, ts.schemas[2].Pool, topicOf(2), 5, 1, "insert")
	time.Sleep(time.Duration(150+rand.IntN(200)) * time.Millisecond)
	require.NoError(t, f.SetTargets(targets(3)))
	clean(2, "removed after the idle poll's wake")

	daSettle(t, f)
	t0 = time.Now()
	require.NoError(t, stop())
	require.Less(t, time.Since(t0), 3*time.Second, "stopping a dormant Fleet")
	clean(3, "stopped while dormant")
}

// Attack 9 (the lane count guard): a relay configured with another lane
// count starts while the only instance of the target is dormant. A
// dormant instance is live (status, /readyz and writers' notifications
// treat it so) and takes its lanes back, at its count, when rows come; but
// its lanes expired within the grace, and ensureLanes counts live
// instances by their unexpired lanes.
//
// Must hold (Run's documented contract): Run returns ErrLaneCountMismatch
// while live instances use a different Config.Lanes. Otherwise the lane
// table is reshaped under the dormant instance, which on waking finds no
// lane of its count (heartbeatSQL: l.lanes = $3) yet is ranked: the new
// relay leaves it its share, and nobody claims that share until the
// dormant instance gives up again.
func TestDormantAttackLaneCountGuard(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "lanes8")
	waitFor(t, "dormant", func() bool { return faState(t, f, "t0").Dormant })
	time.Sleep(500 * time.Millisecond) // its lanes' grace is over
	cfg := ts.relayConfig("lanes16")
	cfg.Pool, cfg.Schema, cfg.Lanes = db.Pool, db.Schema, 16
	r, err := relay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case err := <-done:
		done <- err
		require.ErrorIs(t, err, relay.ErrLaneCountMismatch)
		return
	case <-time.After(3 * time.Second):
	}
	// It runs: show what that does while both are awake.
	var lanes int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT max(lanes) FROM pgbox_relay_lanes`).Scan(&lanes))
	daWrite(t, db.Pool, topicOf(0), 40, 1, "notify")
	var fleetLanes int
	waitFor(t, "the fleet's target awake", func() bool { s := faState(t, f, "t0"); fleetLanes = s.Stats.Lanes; return !s.Dormant })
	t.Errorf("a relay with Lanes 16 started beside a live, dormant instance with Lanes 8 (lane table now %d lanes); "+
		"the dormant instance woke holding %d lanes; ErrLaneCountMismatch was not returned", lanes, fleetLanes)
}

// Attack 7a: the idle poll through pgbouncer in transaction pool mode:
// its pipeline of questions, each with its own Sync, passes through a
// pooler that hands server connections out per transaction.
//
// Must hold: rows of a writer that does not notify reach Kafka while every
// target is dormant, round after round.
func TestDormantAttackIdlePollThroughPgbouncer(t *testing.T) {
	t.Parallel()
	bouncer := faPgbouncerURL(t)
	ts := newTenants(t, 3)
	var targets []relay.Target
	for i, db := range ts.schemas {
		mode := pgx.QueryExecModeExec
		if i%2 == 1 {
			mode = pgx.QueryExecModeSimpleProtocol
		}
		targets = append(targets, relay.Target{Name: fmt.Sprintf("t%d", i), Pool: faPool(t, bouncer, "", mode, 3), Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: ts.relayConfig("bouncer"), Targets: targets, DormantAfter: 300 * time.Millisecond})
	require.NoError(t, err)
	runFleet(t, f)
	const keys = 10
	for round := 1; round <= 3; round++ {
		daSettle(t, f)
		for i, db := range ts.schemas {
			daWrite(t, db.Pool, topicOf(i), keys, round, "insert")
		}
		for i := range ts.schemas {
			require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(i), keys*round, 20*time.Second),
				"round %d, topic %s: targets %+v", round, topicOf(i), f.Targets())
		}
	}
}

// Attack 7b: a dormant target's schema is dropped and created again (a
// tenant restored, re-provisioned) between two idle polls.
//
// Must hold: rows written to the new schema are published.
func TestDormantAttackSchemaRecreatedWhileDormant(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 2, "")
	f, _ := dormantFleet(t, ts, "recreate")
	ctx := context.Background()
	db := ts.schemas[0]
	daWrite(t, db.Pool, topicOf(0), 5, 1, "write")
	require.Equal(t, 5, daCheck(t, ts.addrs, topicOf(0), 5, 20*time.Second))
	daSettle(t, f)
	// Drop and recreate (migrations run again) between two polls as far
	// as a migration's speed allows.
	q := pgx.Identifier{db.Schema}.Sanitize()
	_, err := ts.decoy.Pool.Exec(ctx, "DROP SCHEMA "+q+" CASCADE; CREATE SCHEMA "+q)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = q
	sdb := stdlib.OpenDB(*cfg.ConnConfig.Copy())
	defer sdb.Close()
	require.NoError(t, migrations.Up(ctx, sdb))
	db.Pool.Reset() // the writer's pool: its cached statements name the dropped table
	daWrite(t, db.Pool, topicOf(0), 5, 2, "insert")
	require.Equal(t, 10, daCheck(t, ts.addrs, topicOf(0), 10, 30*time.Second), "after the schema was recreated: targets %+v", f.Targets())
}

// Attack 8a: a paused process whose dormant instance row expired (it is
// renewed every 30 s and lives 90 s; the row's expiry is moved into the
// past here): writers with Notify no longer notify (no live sleeping
// instance), and another instance's heartbeat may prune it.
//
// Must hold: rows are still found (idle poll) and published; the instance
// comes back.
func TestDormantAttackExpiredDormantRow(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "expired")
	ctx := context.Background()
	for round := 1; round <= 3; round++ {
		daSettle(t, f)
		expiry := `UPDATE pgbox_relay_instances SET expires_at = now() - interval '1 second'`
		if round == 3 {
			expiry = `UPDATE pgbox_relay_instances SET expires_at = now() - interval '2 hours'` // pruned by the next heartbeat
		}
		_, err := db.Pool.Exec(ctx, expiry)
		require.NoError(t, err)
		daWrite(t, db.Pool, topicOf(0), 6, round, "notify")
		require.Equal(t, 6*round, daCheck(t, ts.addrs, topicOf(0), 6*round, 20*time.Second), "round %d: %+v", round, f.Targets())
	}
}

// Attack 8b: a wake arrives while dormantSQL waits for a lock on the
// instance row (held here by another session, as a slow server or an
// operator's statement would), before and after the statement's client
// timeout (LeaseTTL/2).
//
// Must hold: the rows are published, in order, and the target ends up
// either dormant or awake, never awake without lanes while rows wait.
func TestDormantAttackWakeWhileGoingDormant(t *testing.T) {
	// Not parallel: its open writing transaction (an xid) would be the
	// oldest running one of the cluster for the floor tests running beside
	// it (TestFloorLongWriter watches its own long writer).
	ts := daTenants(t, 1, "")
	db := ts.schemas[0]
	f, _ := dormantFleet(t, ts, "racing")
	ctx := context.Background()
	const keys = 6
	round := 0
	for _, hold := range []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 800 * time.Millisecond} {
		round++
		daWrite(t, db.Pool, topicOf(0), keys, round, "notify")
		require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(0), keys*round, 20*time.Second))
		// The row is locked once the target sleeps (before DormantAfter).
		var asleep bool
		waitFor(t, "asleep", func() bool {
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(bool_or(sleeping AND kafka_ready), false) FROM pgbox_relay_instances`).Scan(&asleep))
			return asleep
		})
		lock, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = lock.Exec(ctx, `SELECT 1 FROM pgbox_relay_instances FOR UPDATE`)
		require.NoError(t, err)
		waitFor(t, "dormantSQL waiting for the lock", func() bool {
			var n int
			require.NoError(t, ts.decoy.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%least(expires_at%' AND query LIKE '%`+db.Schema+`%'`).Scan(&n))
			if n == 0 {
				// Without the schema in its text (set_config is a separate statement), match any.
				require.NoError(t, ts.decoy.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%least(expires_at%'`).Scan(&n))
			}
			return n > 0
		})
		round++
		go func(round int) {
			w, _ := outbox.NewWriter(outbox.Config{Notify: true})
			_ = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				msgs := make([]outbox.Message, keys)
				for k := range msgs {
					msgs[k] = outbox.Message{Topic: topicOf(0), Key: []byte(keyed(k)), Value: []byte(strconv.Itoa(round))}
				}
				return w.Write(ctx, tx, msgs...)
			})
		}(round)
		time.Sleep(hold)
		require.NoError(t, lock.Rollback(ctx))
		require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(0), keys*round, 20*time.Second),
			"hold %s: targets %+v", hold, f.Targets())
		waitFor(t, "drained", func() bool { return count(t, db) == 0 })
	}
	// And it still works afterwards.
	round++
	daWrite(t, db.Pool, topicOf(0), keys, round, "insert")
	require.Equal(t, keys*round, daCheck(t, ts.addrs, topicOf(0), keys*round, 20*time.Second))
}

// daLock takes an ACCESS EXCLUSIVE lock on db's pgbox_outbox in another
// session (as autovacuum's truncation of the emptied table, an ALTER or a
// VACUUM FULL does) and returns its release.
func daLock(t *testing.T, db *testdb.DB) func() {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{db.Schema, "pgbox_outbox"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	return sync.OnceFunc(func() {
		_ = tx.Rollback(ctx)
		_ = locker.Close(ctx)
	})
}

// Attack 7c: one dormant target's outbox is locked (ACCESS EXCLUSIVE) for
// a long while. The idle poll asks every idle target of the pool in one
// pipeline on one connection: the locked target's question waits, and
// every question behind it with it, until the poll's timeout (5 s); the
// poll then wakes every idle target, and asks again.
//
// Must hold (as TestFleetAttackLockedTargetStarvesPool for awake
// targets): the other targets' rows, written without a notification, are
// published within a few seconds.
func TestDormantAttackLockedTargetBlocksIdlePoll(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 3, "")
	f, _ := dormantFleet(t, ts, "locked")
	daSettle(t, f)
	release := daLock(t, ts.schemas[0])
	defer release()
	time.Sleep(2 * time.Second) // the locked target's question is in every poll now
	for i := 1; i < 3; i++ {
		daWrite(t, ts.schemas[i].Pool, topicOf(i), 10, 1, "insert")
	}
	for i := 1; i < 3; i++ {
		t0 := time.Now()
		n := daCheck(t, ts.addrs, topicOf(i), 10, 8*time.Second)
		require.Equal(t, 10, n, "target %d published %d of 10 rows in %s while another idle target's outbox was locked: %+v",
			i, n, time.Since(t0).Round(time.Millisecond), f.Targets())
	}
}

// Attack 8c: one slow answer to the idle poll (its outbox locked for
// 400 ms, as autovacuum truncating the emptied table does; or the poller
// descheduled between two reads: each answer's time is measured as the
// time since the previous answer was read) marks the target slow: it then
// leaves the idle poll and claims at its own polls for emptyPause (5
// minutes), and cannot go dormant meanwhile (idleWait is only reached
// when mayIdle). The check was made for a held horizon; a transient lock
// or a busy client is not one.
//
// Must hold: a second after the lock is gone, the target is dormant (it
// stayed, or went dormant again) within 10 s (DormantAfter is 300 ms).
func TestDormantAttackSlowAnswerEndsDormancy(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 2, "")
	f, _ := dormantFleet(t, ts, "slowanswer")
	waitFor(t, "t0 dormant", func() bool { return faState(t, f, "t0").Dormant })
	release := daLock(t, ts.schemas[0])
	time.Sleep(400 * time.Millisecond)
	release()
	time.Sleep(time.Second) // the slow answer has come, whatever it did
	t0 := time.Now()
	for !faState(t, f, "t0").Dormant {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("t0 has not gone dormant again 10 s after its idle question was slow once (DormantAfter 300ms): %+v", f.Targets())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Attack 7d: TestDormantAttackLockedTargetBlocksIdlePoll with a lease of
// 10 s (the poll's timeout is max(LeaseTTL, 5 s); the default lease is
// longer still). Before the idle poll each relay asked its own outbox, and
// a locked outbox held up only its own target; in the shared pipeline
// every idle target of the pool waits behind it until the timeout, each
// round, and each timeout then wakes every idle target of the pool at
// once.
//
// Must hold: the other targets' rows, written without a notification, are
// published within 3 s (15 poll intervals).
func TestDormantAttackLockedTargetStallsIdlePoll(t *testing.T) {
	t.Parallel()
	ts := daTenants(t, 3, "")
	cfg := ts.relayConfig("stall")
	cfg.LeaseTTL = 10 * time.Second
	var targets []relay.Target
	for i, db := range ts.schemas {
		targets = append(targets, relay.Target{Name: fmt.Sprintf("t%d", i), Pool: ts.shared, Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: cfg, Targets: targets, DormantAfter: 300 * time.Millisecond})
	require.NoError(t, err)
	runFleet(t, f)
	daSettle(t, f)
	release := daLock(t, ts.schemas[0])
	defer release()
	time.Sleep(2 * time.Second) // the locked target's question is in every poll now
	for i := 1; i < 3; i++ {
		daWrite(t, ts.schemas[i].Pool, topicOf(i), 10, 1, "insert")
	}
	t0 := time.Now()
	for i := 1; i < 3; i++ {
		n := daCheck(t, ts.addrs, topicOf(i), 10, 3*time.Second-time.Since(t0))
		require.Equal(t, 10, n, "target %d published %d of 10 rows in %s while another idle target's outbox was locked: %+v",
			i, n, time.Since(t0).Round(time.Millisecond), f.Targets())
	}
}

// Attack 1: batches in flight (a slow broker: every produce request waits
// up to 250 ms) while the Fleet's target goes dormant and wakes, and a
// plain relay on the same schema takes its lanes and hands them back;
// bursts come at gaps around DormantAfter.
//
// Must hold: every event arrives, every key's events in round order.
func TestDormantAttackSlowBrokerHandOver(t *testing.T) {
	t.Parallel()
	c := kafkatest.New(t)
	ts := &tenants{addrs: c.ListenAddrs(), decoy: testdb.New(t), schemas: []*testdb.DB{testdb.New(t)}}
	kafkatest.CreateTopic(t, ts.addrs, topicOf(0), 3, nil)
	cfg, err := pgxpool.ParseConfig(ts.decoy.URL)
	require.NoError(t, err)
	cfg.MaxConns = 3
	ts.shared, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(ts.shared.Close)
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(3, 4))
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		d := time.Duration(rng.IntN(250)) * time.Millisecond
		mu.Unlock()
		time.Sleep(d)
		return nil, nil, false
	})
	f, _ := dormantFleet(t, ts, "slowfleet")
	db := ts.schemas[0]
	pcfg := ts.relayConfig("slowplain")
	pcfg.Pool, pcfg.Schema, pcfg.BatchSize = db.Pool, db.Schema, 5
	start(t, pcfg)
	const keys, rounds = 10, 12
	modes := []string{"notify", "insert", "write", "copy"}
	dormant := 0
	for round := 1; round <= rounds; round++ {
		if faState(t, f, "t0").Dormant {
			dormant++
		}
		daWrite(t, db.Pool, topicOf(0), keys, round, modes[round%len(modes)])
		mu.Lock()
		// Quiet for busyWindow (2 s) + sleepGrace + DormantAfter (about
		// 2.7 s) makes the Fleet's target dormant: gaps straddle it.
		gap := time.Duration(2200+rng.IntN(1200)) * time.Millisecond
		mu.Unlock()
		time.Sleep(gap)
	}
	n := daCheck(t, ts.addrs, topicOf(0), keys*rounds, 90*time.Second)
	require.Equal(t, keys*rounds, n, "distinct events: %+v", f.Targets())
	t.Logf("the Fleet's target was dormant at %d of %d bursts", dormant, rounds)
}
