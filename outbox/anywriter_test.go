package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// A writer in another language (psql, a trigger on a business table) needs
// only topic, key and value: the row gets the slot outbox.Write would give
// it (so a key's rows share one slot, one lane, one order, whoever wrote
// them) and a UUIDv7 event id. pgbox_outbox_slot is internal/slot's formula.
func TestPlainInsertGetsWritersSlotAndEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	keys := [][]byte{[]byte("order-1"), []byte("a"), {}, []byte("payments-42"), []byte("ünïcode-ключ"), {0, 255, 7}, nil}
	for i := range 200 {
		keys = append(keys, fmt.Appendf(nil, "key-%d-%x", i, i*7919))
	}
	before := time.Now().Add(-time.Second)
	for _, k := range keys {
		var id outbox.EventID
		var got int
		require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', $1, 'v')
			RETURNING event_id, slot`, k).Scan(&id, &got))
		require.Equal(t, slot.Of(k, id), got, "key %q: the slot outbox.Write gives it", k)
		require.Equal(t, byte(0x70), id[6]&0xf0, "a version 7 UUID")
		require.Equal(t, byte(0x80), id[8]&0xc0, "RFC 4122 variant")
		ms := int64(id[0])<<40 | int64(id[1])<<32 | int64(id[2])<<24 | int64(id[3])<<16 | int64(id[4])<<8 | int64(id[5])
		at := time.UnixMilli(ms)
		require.True(t, at.After(before) && at.Before(time.Now().Add(time.Second)), "its time is now: %s", at)
	}
	// A writer that names a slot keeps it (outbox.Write does: the trigger
	// fires only for a missing one).
	var kept int
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
		VALUES (gen_random_uuid(), 3, 't', 'order-1', 'v') RETURNING slot`).Scan(&kept))
	require.Equal(t, 3, kept)
}

// docs/outbox-sql.md's example trigger, run as the doc shows it: each
// change of a business row commits with its event, with the slot and
// event id outbox.Write would give, in the order the changes committed;
// a rolled-back change leaves no event. And COPY of topic, key and value.
func TestDocTriggerExample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	doc, err := os.ReadFile("../docs/outbox-sql.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(doc), "<!-- example: trigger")
	require.True(t, ok, "docs/outbox-sql.md has the example trigger")
	_, block, ok := strings.Cut(after, "```sql\n")
	require.True(t, ok)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	_, err = db.Pool.Exec(ctx, block)
	require.NoError(t, err, "the doc's SQL runs")

	for _, q := range []string{
		`INSERT INTO orders VALUES (42, 'new', 1250)`,
		`UPDATE orders SET status = 'paid' WHERE id = 42`,
		`INSERT INTO orders VALUES (7, 'new', 99)`,
		`UPDATE orders SET status = 'shipped' WHERE id = 42`,
	} {
		_, err := db.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE orders SET status = 'cancelled' WHERE id = 42`)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	_, err = db.Pool.CopyFrom(ctx, pgx.Identifier{"pgbox_outbox"}, []string{"topic", "key", "value"},
		pgx.CopyFromRows([][]any{{"bulk.v1", []byte("b-1"), []byte("x")}, {"bulk.v1", []byte("b-2"), []byte("y")}}))
	require.NoError(t, err)

	rows, err := db.Pool.Query(ctx, `SELECT topic, key, value, slot, event_id FROM pgbox_outbox ORDER BY id`)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var topic string
		var key, value []byte
		var sl int
		var id outbox.EventID
		require.NoError(t, rows.Scan(&topic, &key, &value, &sl, &id))
		require.Equal(t, slot.Of(key, id), sl, "key %q", key)
		got = append(got, fmt.Sprintf("%s %s %s", topic, key, value))
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{
		`orders.v1 42 {"id": 42, "status": "new", "total_cents": 1250}`,
		`orders.v1 42 {"id": 42, "status": "paid", "total_cents": 1250}`,
		`orders.v1 7 {"id": 7, "status": "new", "total_cents": 99}`,
		`orders.v1 42 {"id": 42, "status": "shipped", "total_cents": 1250}`,
		`bulk.v1 b-1 x`,
		`bulk.v1 b-2 y`,
	}, got, "one event per committed change, in commit order; none for the rolled-back one")
}
