package relay

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/migrations"
	"github.com/pgbox/pgbox/outbox"
)

// claim reads pgbox_outbox_claim2's result with targets declared once and
// only the columns each kind of row fills, the claim-wide ones from the
// first slot row (migration 00140 sends them there only). It must read the
// same claim as decoding every column of every row (claimEveryColumn): rows
// with headers of different lengths beside rows without, keyless rows, a
// rewind (the rewind arrays), a parked row.
func TestClaimReadsWhatEveryColumnSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newFloorBundle(t)
	var msgs []outbox.Message
	for i := range 60 {
		m := outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "k-%d", i%7), Value: fmt.Appendf(nil, "v-%d", i)}
		switch i % 4 {
		case 0:
			m.Headers = []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("2")}, {Key: "c"}}
		case 1:
			m.Headers = []outbox.Header{{Key: fmt.Sprint("only-", i), Value: []byte("x")}}
		case 2:
			m.Key = nil
		}
		msgs = append(msgs, m)
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	_, err := b.db.Pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now() WHERE id = (SELECT min(id) FROM pgbox_outbox WHERE key = 'k-3')`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES (3, 1), (200, 5)`)
	require.NoError(t, err)

	for round := range 3 {
		a := b.r.floors.args(b.r.floors.order(nil), false)
		got, err := b.r.claim(ctx, &a)
		require.NoError(t, err)
		want, err := b.r.claimEveryColumn(ctx, &a, true)
		require.NoError(t, err)
		require.NotEmpty(t, got.rows)
		require.Len(t, got.meta.slots, 256)
		if round == 0 {
			require.NotEmpty(t, got.meta.rwSlots, "the rewinds are read")
		}
		_, ok := parseSnapshot(got.meta.snap)
		require.True(t, ok, "the snapshot %q is read", got.meta.snap)
		// Each claim reads its own snapshot: other tests' transactions move it.
		got.meta.snap, want.meta.snap = "", ""
		require.Equal(t, want, got, "round %d", round)
		b.r.floors.claimed(&got, b.r.claimPerSlot(), b.r.cfg.BatchSize, time.Now(), true)
	}
}

// claimEveryColumn is claim as it read the result before migration 00140:
// every column of every row, into pointers declared per row. With
// firstOnly, the claim-wide columns come from the first slot row, which
// alone carries them since 00140 (it checks that the others are NULL);
// without, from every slot row (the last one wins), as claim read
// 00120's result, where every slot row carried them.
func (r *Relay) claimEveryColumn(ctx context.Context, a *claimArgs, firstOnly bool) (claimed, error) {
	a.instance, a.lanes, a.perSlot, a.batch = r.id, r.cfg.Lanes, r.claimPerSlot(), r.cfg.BatchSize
	rows, err := r.cfg.Pool.Query(ctx, claimSQL, a.sql()...)
	if err != nil {
		return claimed{}, err
	}
	defer rows.Close()
	c := claimed{meta: claimMeta{sweep: a.sweep, rescanFrom: a.settled + 1}}
	for rows.Next() {
		var (
			x                          row
			id, floor, seq, hw, rwSeen *int64
			eventID                    *outbox.EventID
			topic, off, ident, snap    *string
			createdAt                  *time.Time
			attempts                   *int32
			reset, rescan              *bool
			rwSlots                    []int32
			rwFrom                     []int64
		)
		if err := rows.Scan(&id, &eventID, &x.slot, &topic, &x.key, &x.value, &x.headers, &createdAt, &attempts, &x.epoch,
			&floor, &seq, &hw, &off, &ident, &reset, &rwSeen, &rwSlots, &rwFrom, &rescan, &snap); err != nil {
			return claimed{}, err
		}
		if id == nil {
			m := &c.meta
			first := len(m.slots) == 0
			m.slots, m.epochs, m.floors = append(m.slots, x.slot), append(m.epochs, x.epoch), append(m.floors, *floor)
			if firstOnly && !first {
				if seq != nil || hw != nil || off != nil || ident != nil || reset != nil || rwSeen != nil || rwSlots != nil ||
					rwFrom != nil || rescan != nil || snap != nil {
					return claimed{}, fmt.Errorf("slot row %d (slot %d) carries claim-wide columns", len(m.slots), x.slot)
				}
				continue
			}
			m.seqLast, m.seqHW, m.seqOff, m.ident, m.reset = seq, deref(hw), deref(off), deref(ident), deref(reset)
			m.rewindSeen, m.rwSlots, m.rwFrom, m.rescan, m.snap = deref(rwSeen), rwSlots, rwFrom, deref(rescan), deref(snap)
			continue
		}
		x.id, x.eventID, x.topic, x.createdAt, x.attempts = *id, *eventID, *topic, *createdAt, *attempts
		c.rows = append(c.rows, x)
	}
	return c, rows.Err()
}

// Migration 00140 changes how pgbox_outbox_claim2 computes its answer,
// not the answer: in one snapshot (a REPEATABLE READ transaction), 00120's
// body (as 00140's Down restores it) and 00140's return the same rows and
// slot rows, except that 00140 leaves the claim-wide columns NULL on every
// slot row after the first. States: fresh floors, floors under the right
// and a wrong epoch, a wrong ident, a sequence read lower than seen,
// rewinds, a parked key, an ended long writer (the rescan), the sweep,
// lanes of another owner, a lane count that is not the table's, a lane
// count of 0, another instance.
func TestClaimCostMigrationClaimsWhat00120Claims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool

	// 00120's body, from 00140's Down, which must be 00120's text.
	down := sqlFile(t, "00140_claim_cost.sql", "-- +goose Down")
	orig := sqlFile(t, "00120_outbox_any_writer.sql", "")
	require.Equal(t, strings.Replace(orig, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1), down, "00140's Down restores 00120's claim")
	_, err := pool.Exec(ctx, strings.Replace(down, "FUNCTION pgbox_outbox_claim2(", "FUNCTION pgbox_outbox_claim2_00120(", 1))
	require.NoError(t, err)

	_, err = pool.Exec(ctx, createLanesSQL, 4)
	require.NoError(t, err)
	var held, released, live int
	require.NoError(t, pool.QueryRow(ctx, heartbeatSQL, "me", "1 hour", 4, "0s", true, false).Scan(&held, &released, &live, new(int), new(int)))
	_, err = pool.Exec(ctx, `UPDATE pgbox_relay_lanes SET owner = 'other' WHERE lane = 1`)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range 300 {
		m := outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "k-%d", i%40), Value: fmt.Appendf(nil, "v-%d", i)}
		if i%9 == 0 {
			m.Key = nil
		}
		msgs = append(msgs, m)
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
	_, err = pool.Exec(ctx, `UPDATE pgbox_outbox SET parked_at = now() WHERE id = (SELECT min(id) FROM pgbox_outbox WHERE key = 'k-3')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES (3, 1), (200, 5), (3, 7)`)
	require.NoError(t, err)
	var ended int64 // a writer that has ended
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&ended)
	}))
	var epoch int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT epoch FROM pgbox_relay_lanes WHERE lane = 0`).Scan(&epoch))

	slots := make([]int32, 256)
	zeros, floors, epochs := make([]int64, 256), make([]int64, 256), make([]int64, 256)
	for i := range slots {
		slots[i] = int32((i*37 + 11) % 256) // not in slot order
		floors[i] = int64(i % 50)
		if i%3 != 0 {
			epochs[i] = epoch
		}
	}
	type args struct {
		instance                 string
		lanes                    int
		floors, epochs           []int64
		ident                    string
		seqSeen, rewind, settled int64
		writers                  []int64
		sweep                    bool
		perSlot, batch           int
	}
	call := func(tx pgx.Tx, fn string, a args) [][]any {
		rows, err := tx.Query(ctx, `SELECT * FROM `+fn+`($1, $2, $3::int[], $4::bigint[], $5::bigint[], $6, $7, $8, $9, $10::bigint[], $11, $12, $13)`,
			a.instance, a.lanes, slots, a.floors, a.epochs, a.ident, a.seqSeen, a.rewind, a.settled, a.writers, a.sweep, a.perSlot, a.batch)
		require.NoError(t, err)
		var out [][]any
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(t, err)
			out = append(out, v)
		}
		require.NoError(t, rows.Err())
		return out
	}
	var ident string
	compare := func(name string, a args) {
		require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			old, now := call(tx, "pgbox_outbox_claim2_00120", a), call(tx, "pgbox_outbox_claim2", a)
			var want [][]any
			for i, v := range old {
				want = append(want, slices.Clone(v))
				if v[0] == nil && i > 0 { // a slot row after the first
					for j := 11; j < claimCols; j++ {
						want[i][j] = nil
					}
				}
			}
			require.Equal(t, want, now, name)
			if len(old) > 0 && ident == "" {
				ident = old[0][14].(string)
			}
			t.Logf("%s: %d result rows", name, len(old))
			return nil
		}))
	}
	base := args{instance: "me", lanes: 4, floors: zeros, epochs: epochs, settled: 1, writers: []int64{}, perSlot: 7, batch: 100}
	compare("fresh", base)
	require.NotEmpty(t, ident)
	a := base
	a.floors, a.ident, a.seqSeen, a.rewind = floors, ident, 10, 1_000_000
	compare("floors", a)
	a.rewind = 0
	compare("rewinds", a)
	a.rewind = 1_000_000
	a.seqSeen = 1 << 40
	compare("sequence went back", a)
	a.seqSeen = 10
	a.ident = "other"
	compare("another ident", a)
	a.ident = ident
	a.writers, a.settled = []int64{ended, ended + 1_000_000}, 20
	compare("a long writer ended", a)
	a.writers, a.settled = []int64{ended + 1_000_000}, 20
	compare("a long writer runs", a)
	a.writers = []int64{}
	a.sweep = true
	compare("sweep", a)
	a.sweep = false
	a.batch, a.perSlot = 1, 16
	compare("batch of one", a)
	a.batch, a.perSlot = 10_000, 10_000
	compare("everything", a)
	for _, l := range []int{3, 0, -4} {
		b := base
		b.lanes = l
		compare(fmt.Sprint("lanes ", l), b)
	}
	b := base
	b.instance = "other"
	compare("the other instance", b)
}

// sqlFile returns the claim function's CREATE statement in the migration
// file name, after the line after (from the start when empty).
func sqlFile(t *testing.T, name, after string) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS(), name)
	require.NoError(t, err)
	s := string(b)
	if after != "" {
		_, s, _ = strings.Cut(s, after)
	}
	i := strings.Index(s, "CREATE ")
	for i >= 0 && !strings.Contains(s[i:i+60], "FUNCTION pgbox_outbox_claim2(") {
		j := strings.Index(s[i+1:], "CREATE ")
		if j < 0 {
			i = -1
			break
		}
		i += 1 + j
	}
	require.GreaterOrEqual(t, i, 0, "no pgbox_outbox_claim2 in %s", name)
	end := strings.Index(s[i:], "$fn$;")
	require.Positive(t, end)
	return s[i : i+end+len("$fn$;")]
}
