package relay

// Review of 7d91c40 (the finish matches rows by id and event id): the
// finish statement driven directly, through Relay.tally and Relay.finish (so
// the Go side's encoding of ids, event ids and empty arrays is what runs),
// with the outbox changed between the claim and the finish as an operator
// or an unusual writer could change it. End-to-end attacks are in
// attackfinish_test.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// finishRig is one schema with one lane held by a relay "a" built by hand
// (testRelay), which claims and finishes batches when the test says so.
type finishRig struct {
	t  *testing.T
	db *testdb.DB
	r  *Relay
}

func newFinishRig(t *testing.T, maxAttempts int, window time.Duration) *finishRig {
	t.Helper()
	ctx := context.Background()
	db := testdb.New(t)
	_, err := db.Pool.Exec(ctx, createLanesSQL, 1)
	require.NoError(t, err)
	require.NoError(t, db.Pool.QueryRow(ctx, heartbeatSQL, "a", "1 hour", 1, "0s", true, false).
		Scan(new(int), new(int), new(int), new(int), new(int)))
	r := testRelay(Config{Pool: db.Pool, BatchSize: 100, Lanes: 1, MaxAttempts: maxAttempts,
		UnknownTopicWindow: window, StopTimeout: time.Second}, "a")
	r.log = slog.New(slog.DiscardHandler)
	return &finishRig{t: t, db: db, r: r}
}

func (g *finishRig) exec(sql string, args ...any) {
	g.t.Helper()
	_, err := g.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(g.t, err)
}

func (g *finishRig) claim() []row {
	g.t.Helper()
	c, err := g.r.claimSlots(context.Background(), g.r.floors.order(nil))
	require.NoError(g.t, err)
	return c.rows
}

// finish records rows' outcome (outcome[i]: nil published, an error failed,
// absent not tried) as a pass does.
func (g *finishRig) finish(rows []row, outcome map[int]error) {
	g.t.Helper()
	t := g.r.tally(rows, outcome)
	b := finishedBatch{tally: t, rows: len(rows), start: time.Now(), claimed: time.Now(), sent: time.Now()}
	_, err := g.r.finish(context.Background(), &b)
	require.NoError(g.t, err)
}

// outboxRow is a row as the test checks it.
type outboxRow struct {
	ID       int64
	EventID  pgtype.UUID
	Topic    string
	Value    string
	Attempts int
	Parked   bool
}

func (g *finishRig) rows() []outboxRow {
	g.t.Helper()
	rs, err := g.db.Pool.Query(context.Background(),
		`SELECT id, event_id, topic, convert_from(value, 'UTF8'), attempts, parked_at IS NOT NULL FROM pgbox_outbox ORDER BY id`)
	require.NoError(g.t, err)
	out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[outboxRow])
	require.NoError(g.t, err)
	return out
}

func uuidOf(e outbox.EventID) pgtype.UUID { return pgtype.UUID{Bytes: e, Valid: true} }

// (1a) Swapped event ids after a sequence reset. A batch of two rows (ids
// 1 and 2, event ids A and B) is claimed and published; meanwhile the
// outbox is emptied with its sequence restarted, and two new, different
// messages are written that take ids 1 and 2 again, carrying the event ids
// B and A (a writer that sets its own event ids, e.g. from a business key or
// re-inserted from a file, in another order). Neither new row was sent. The
// finish must delete neither: the delete's `id = ANY($1) AND event_id =
// ANY($8)` is not pairwise, so (1, B) matches id 1 (sent as (1, A)) and
// event B (sent as (2, B)).
func TestAttackFinishSwappedEventIDsAfterResetKeepNewRows(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k1', 'old-1'), ('t', 'k2', 'old-2')`)
	rows := g.claim()
	require.Len(t, rows, 2)
	byID := map[int64]row{}
	for _, x := range rows {
		byID[x.id] = x
	}
	require.Contains(t, byID, int64(1))
	require.Contains(t, byID, int64(2))

	g.exec(`TRUNCATE pgbox_outbox RESTART IDENTITY`)
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES ($1, 'other', 'x', 'new-1')`, uuidOf(byID[2].eventID))
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES ($1, 'other', 'y', 'new-2')`, uuidOf(byID[1].eventID))
	before := g.rows()
	require.Len(t, before, 2)
	require.Equal(t, []int64{1, 2}, []int64{before[0].ID, before[1].ID}, "the new rows took the sent rows' ids")

	g.finish(rows, map[int]error{0: nil, 1: nil})
	after := g.rows()
	require.Len(t, after, 2, "new rows that were never sent are still in the outbox (left: %+v)", after)
}

// (1b) The failure update after a reset, with swapped event ids: the new
// rows at the failed rows' ids (their event ids swapped) get no attempt and
// are not parked, however low MaxAttempts.
func TestAttackFinishFailureAfterResetSparesNewRows(t *testing.T) {
	t.Parallel()
	for _, swap := range []bool{false, true} {
		t.Run(fmt.Sprintf("swapped=%v", swap), func(t *testing.T) {
			t.Parallel()
			g := newFinishRig(t, 1, 0)
			g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k1', 'old-1'), ('t', 'k2', 'old-2'), ('t', 'k3', 'old-3')`)
			rows := g.claim()
			require.Len(t, rows, 3)
			evOf := map[int64]outbox.EventID{}
			for _, x := range rows {
				evOf[x.id] = x.eventID
			}
			g.exec(`TRUNCATE pgbox_outbox RESTART IDENTITY`)
			for i := range rows {
				ev := pgtype.UUID{} // the default: a fresh event id
				if swap {           // new id i+1 carries the event id sent at id i+2 (3: 1)
					ev = uuidOf(evOf[int64((i+1)%len(rows)+1)])
				}
				if ev.Valid {
					g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES ($1, 'other', $2, 'new')`, ev, fmt.Sprint("n", i))
				} else {
					g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('other', $1, 'new')`, fmt.Sprint("n", i))
				}
			}
			require.Equal(t, []int64{1, 2, 3}, func() (ids []int64) {
				for _, x := range g.rows() {
					ids = append(ids, x.ID)
				}
				return ids
			}(), "the new rows took the failed rows' ids")
			g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge, 1: sarama.ErrUnknownTopicOrPartition, 2: sarama.ErrInvalidRecord})
			for _, x := range g.rows() {
				require.Zero(t, x.Attempts, "row %d was never sent: no attempt on it", x.ID)
				require.False(t, x.Parked, "row %d was never sent: not parked", x.ID)
			}
			require.Len(t, g.rows(), 3)
			require.EqualValues(t, 0, g.r.parked.Load())
		})
	}
}

// (1c) Duplicate event ids without a reset: three rows of one event id
// (different keys and topics), one published, one failed, one held back. The
// finish deletes exactly the published row, counts the attempt on exactly
// the failed one, and the next pass settles the rest: no sent row stays
// behind, none unsent is deleted.
func TestAttackFinishDuplicateEventIDsSettleEachRow(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 2, 0)
	ev := uuidOf(outbox.NewEventID())
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES ($1, 't', 'k1', 'a'), ($1, 't', 'k2', 'b'), ($1, 'u', 'k1', 'c')`, ev)
	rows := g.claim()
	require.Len(t, rows, 3)
	val := map[int64]string{}
	for _, x := range g.rows() {
		val[x.ID] = x.Value
	}
	idx := map[string]int{}
	for i, x := range rows {
		idx[val[x.id]] = i
	}
	g.finish(rows, map[int]error{idx["a"]: nil, idx["b"]: sarama.ErrMessageSizeTooLarge})
	left := g.rows()
	require.Len(t, left, 2)
	require.Equal(t, "b", left[0].Value)
	require.Equal(t, 1, left[0].Attempts)
	require.False(t, left[0].Parked)
	require.Equal(t, "c", left[1].Value)
	require.Zero(t, left[1].Attempts)

	rows = g.claim()
	require.Len(t, rows, 2)
	out := map[int]error{}
	for i, x := range rows {
		if val[x.id] == "b" {
			out[i] = sarama.ErrMessageSizeTooLarge
		} else {
			out[i] = nil
		}
	}
	g.finish(rows, out)
	left = g.rows()
	require.Len(t, left, 1)
	require.Equal(t, "b", left[0].Value)
	require.Equal(t, 2, left[0].Attempts)
	require.True(t, left[0].Parked, "parked at MaxAttempts")
	require.EqualValues(t, 1, g.r.parked.Load())
}

// (4) The failure path under the new match: attempts counted, parked at
// MaxAttempts, a missing topic parked only once its window has passed (and
// at MaxAttempts under NoUnknownTopicWindow); a batch all failed (no
// published ids: NULL $1, empty $8) and a batch all published (NULL $2,
// empty $9) alike.
func TestAttackFinishFailurePathStillCounts(t *testing.T) {
	t.Parallel()
	t.Run("maxattempts", func(t *testing.T) {
		t.Parallel()
		g := newFinishRig(t, 3, time.Hour)
		g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'k1', 'big'), ('t', 'k2', 'big2')`)
		for attempt := 1; attempt <= 3; attempt++ {
			rows := g.claim()
			require.Len(t, rows, 2, "attempt %d", attempt)
			g.finish(rows, map[int]error{0: sarama.ErrMessageSizeTooLarge, 1: sarama.ErrMessageSizeTooLarge}) // all failed
			for _, x := range g.rows() {
				require.Equal(t, attempt, x.Attempts)
				require.Equal(t, attempt == 3, x.Parked)
			}
		}
		require.Empty(t, g.claim(), "parked rows are not claimed")
		require.EqualValues(t, 2, g.r.parked.Load())
	})
	t.Run("unknown-topic-window", func(t *testing.T) {
		t.Parallel()
		g := newFinishRig(t, 1, time.Hour)
		g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('missing', 'k', 'v')`)
		for range 3 {
			rows := g.claim()
			require.Len(t, rows, 1)
			g.finish(rows, map[int]error{0: sarama.ErrUnknownTopicOrPartition})
		}
		x := g.rows()[0]
		require.Equal(t, 3, x.Attempts)
		require.False(t, x.Parked, "within the window: not parked at MaxAttempts")
		g.exec(`UPDATE pgbox_outbox SET failing_since = now() - interval '2 hours'`)
		rows := g.claim()
		require.Len(t, rows, 1)
		g.finish(rows, map[int]error{0: sarama.ErrUnknownTopicOrPartition})
		require.True(t, g.rows()[0].Parked, "parked once the window has passed")
	})
	t.Run("no-window", func(t *testing.T) {
		t.Parallel()
		g := newFinishRig(t, 2, NoUnknownTopicWindow)
		g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('missing', 'k', 'v')`)
		for attempt := 1; attempt <= 2; attempt++ {
			rows := g.claim()
			require.Len(t, rows, 1)
			g.finish(rows, map[int]error{0: sarama.ErrUnknownTopicOrPartition})
			require.Equal(t, attempt == 2, g.rows()[0].Parked)
		}
	})
	t.Run("all-published", func(t *testing.T) {
		t.Parallel()
		g := newFinishRig(t, 1, 0)
		g.exec(`INSERT INTO pgbox_outbox (topic, key, value) SELECT 't', convert_to('k' || g, 'UTF8'), 'v' FROM generate_series(1, 50) g`)
		rows := g.claim()
		require.Len(t, rows, 50)
		out := map[int]error{}
		for i := range rows {
			out[i] = nil
		}
		g.finish(rows, out)
		require.Empty(t, g.rows())
		require.EqualValues(t, 50, g.r.published.Load())
	})
	t.Run("mixed-with-held-and-transient", func(t *testing.T) {
		t.Parallel()
		g := newFinishRig(t, 1, 0)
		g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'a', 'ok'), ('t', 'b', 'bad'), ('t', 'c', 'transient'), ('t', 'd', 'held')`)
		rows := g.claim()
		require.Len(t, rows, 4)
		out := map[int]error{}
		for i, x := range rows {
			switch x.id { // ids 1 ok, 2 bad, 3 transient, 4 held (not tried)
			case 1:
				out[i] = nil
			case 2:
				out[i] = sarama.ErrInvalidRecord
			case 3:
				out[i] = errors.New("connection reset")
			}
		}
		g.finish(rows, out)
		left := g.rows()
		require.Len(t, left, 3)
		require.Equal(t, "bad", left[0].Value)
		require.True(t, left[0].Parked)
		require.Equal(t, []int{1, 0, 0}, []int{left[0].Attempts, left[1].Attempts, left[2].Attempts})
	})
}

// (2, 3) Every outbox row has an event id: the column is NOT NULL since
// 00002 (v0.1.0), no migration drops it, and a writer that sets it NULL
// (INSERT or COPY) is refused; rows of every writer (outbox.Write, a plain
// INSERT without event_id, COPY) are claimed with their event ids and
// deleted by the finish that published them, so none is sent again.
func TestAttackFinishEveryRowHasAnEventID(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	ctx := context.Background()
	var notNull bool
	require.NoError(t, g.db.Pool.QueryRow(ctx, `SELECT attnotnull FROM pg_attribute
		WHERE attrelid = 'pgbox_outbox'::regclass AND attname = 'event_id'`).Scan(&notNull))
	require.True(t, notNull, "pgbox_outbox.event_id is NOT NULL")

	_, err := g.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES (NULL, 't', 'k', 'v')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23502", pgErr.Code, "NULL event id refused")
	_, err = g.db.Pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"event_id", "topic", "key", "value"},
		pgx.CopyFromRows([][]any{{nil, "t", []byte("k"), []byte("v")}}))
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23502", pgErr.Code, "NULL event id refused by COPY")

	tx, err := g.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, outbox.Write(ctx, tx, outbox.Message{Topic: "t", Key: []byte("w"), Value: []byte("write")}))
	require.NoError(t, tx.Commit(ctx))
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'i', 'insert')`)
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES (DEFAULT, 't', 'd', 'default')`)
	_, err = g.db.Pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"topic", "key", "value"},
		pgx.CopyFromRows([][]any{{"t", []byte("c"), []byte("copy")}}))
	require.NoError(t, err)
	rows := g.claim()
	require.Len(t, rows, 4)
	out := map[int]error{}
	for i, x := range rows {
		require.NotEqual(t, outbox.EventID{}, x.eventID, "row %d claimed with an event id", x.id)
		out[i] = nil
	}
	g.finish(rows, out)
	require.Empty(t, g.rows(), "every published row deleted")
}

// (2, beyond the contract) An operator dropped the NOT NULL (or a restore
// without constraints) and a row came with a NULL event id: the claim reads
// it as the zero UUID (claimed.read keeps eventID.Bytes, not Valid), the
// relay publishes it and the finish must delete it, as the finish by id
// alone did: else it stays, and is published again at every sweep, without
// end.
func TestAttackFinishNullEventIDRowNotResentForever(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`ALTER TABLE pgbox_outbox ALTER COLUMN event_id DROP NOT NULL`)
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES (NULL, 't', 'k', 'v')`)
	rows := g.claim()
	require.Len(t, rows, 1)
	g.finish(rows, map[int]error{0: nil})
	require.Empty(t, g.rows(), "a published row is deleted, NULL event id or not")

	// And one that fails is counted and parked (MaxAttempts 1 here would
	// otherwise never come: retried, its key held, without end).
	g.r.cfg.MaxAttempts = 1
	g.exec(`INSERT INTO pgbox_outbox (event_id, topic, key, value) VALUES (NULL, 't', 'k', 'v')`)
	rows = g.claim()
	require.Len(t, rows, 1)
	g.finish(rows, map[int]error{0: sarama.ErrInvalidRecord})
	left := g.rows()
	require.Len(t, left, 1)
	require.Equal(t, 1, left[0].Attempts)
	require.True(t, left[0].Parked)
}

// (1, cost) The finish is a hot path: its delete must keep an index scan on
// the primary key, with no sequential scan or hash join over the outbox, in
// the generic plan a prepared statement ends up with (pgx prepares it; after
// five custom plans PostgreSQL keeps the generic one, whose estimate of 10
// ids is far cheaper than a 2,000-id custom plan). And it must not test a
// row against the event ids with `= ANY ($8)` as a filter: in a generic
// plan the array is a parameter, not hashed (PostgreSQL hashes only a
// constant array), so each deleted row searches the array linearly, 2,000 x
// 2,000 comparisons per batch (TestAttackFinishDeleteCost: 9.1 ms against
// 4.2 ms for the delete by id alone, 2,000 rows of 50,000).
//
// (An outbox analyzed while empty gets a sequential scan in every form of
// the delete, by id alone as well: estimated empty, and re-planned at its
// next analyze. Not tested here.)
func TestAttackFinishGenericPlanUsesPrimaryKey(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) SELECT 't', convert_to('k' || (g % 500), 'UTF8'), 'v' FROM generate_series(1, 20000) g`)
	g.exec(`ANALYZE pgbox_outbox`)
	plan := explainGeneric(t, g.db, finishSQL, 2000)
	t.Logf("generic plan, 20,000 rows in the outbox:\n%s", plan)
	require.Contains(t, plan, "Delete on pgbox_outbox")
	del := plan[strings.Index(plan, "Delete on pgbox_outbox"):]
	if i := strings.Index(del, "Update on"); i >= 0 {
		del = del[:i]
	}
	require.Contains(t, del, "Index Scan using pgbox_outbox_pkey", "the delete reads the primary key")
	require.NotContains(t, del, "Seq Scan on pgbox_outbox", "no sequential scan of the outbox")
	require.NotContains(t, del, "Hash Join", "no hash join over the outbox (a hash of the ids, beside an index scan of the outbox, is fine)")
	require.NotContains(t, del, "= ANY ($8)", "no linear search of the event ids per row")
}

// explainGeneric is the generic plan of sql (finishSQL's parameters) for a
// batch of n published ids, none failed.
func explainGeneric(t *testing.T, db *testdb.DB, sql string, n int) string {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pc := conn.Conn().PgConn()
	ids, evs := make([]string, n), make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprint(i + 1)
		evs[i] = outbox.NewEventID().String()
	}
	_, err = pc.Exec(ctx, `SET plan_cache_mode = force_generic_plan; PREPARE attack_finish AS `+sql).ReadAll()
	require.NoError(t, err)
	defer func() {
		_, _ = pc.Exec(ctx, `DEALLOCATE attack_finish; RESET plan_cache_mode`).ReadAll()
	}()
	res, err := pc.Exec(ctx, fmt.Sprintf(`EXPLAIN EXECUTE attack_finish('{%s}', '{}', '{}', '{}', 5, '{}', '0s', '{%s}', '{}')`,
		strings.Join(ids, ","), strings.Join(evs, ","))).ReadAll()
	require.NoError(t, err)
	var b strings.Builder
	for _, r := range res {
		for _, row := range r.Rows {
			b.Write(row[0])
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// (6) The finish's arguments ([]pgtype.UUID event ids, empty arrays for a
// batch all published or all failed) encode in every exec mode a relay may
// run with, PgBouncer's exec and simple_protocol included: a published row
// is deleted, a failed one counted.
func TestAttackFinishExecModes(t *testing.T) {
	t.Parallel()
	modes := map[string]pgx.QueryExecMode{"CacheStatement": pgx.QueryExecModeCacheStatement, "CacheDescribe": pgx.QueryExecModeCacheDescribe,
		"Exec": pgx.QueryExecModeExec, "SimpleProtocol": pgx.QueryExecModeSimpleProtocol, "DescribeExec": pgx.QueryExecModeDescribeExec}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			g := newFinishRig(t, 5, 0)
			cfg, err := pgxpool.ParseConfig(testdb.ServerURL(t))
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["search_path"] = g.db.Schema
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			g.r = testRelay(Config{Pool: pool, BatchSize: 100, Lanes: 1, MaxAttempts: 5, StopTimeout: time.Second}, "a")
			g.r.log = slog.New(slog.DiscardHandler)
			g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'a', 'ok'), ('t', 'b', 'bad')`)
			rows := g.claim()
			require.Len(t, rows, 2)
			out := map[int]error{}
			for i, x := range rows {
				out[i] = nil
				if x.id == 2 {
					out[i] = sarama.ErrInvalidRecord
				}
			}
			g.finish(rows, out)
			left := g.rows()
			require.Len(t, left, 1)
			require.Equal(t, "bad", left[0].Value)
			require.Equal(t, 1, left[0].Attempts)
			g.finish(g.claim(), map[int]error{0: sarama.ErrInvalidRecord}) // all failed
			require.Equal(t, 2, g.rows()[0].Attempts)
			g.finish(g.claim(), map[int]error{0: nil}) // all published
			require.Empty(t, g.rows())
		})
	}
}
