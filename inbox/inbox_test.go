package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

type testBundle struct {
	db   *testdb.DB
	pool *pgxpool.Pool
	kind txKind  // of the transactions begin and process open (kindPgx when unset)
	sdb  *sql.DB // sqlDB's
	// conflicts counts ownedTx's runs ended by an owntx.Conflict.
	conflicts int
}

// setup gives the test its own migrated schema with a business table,
// payments, whose rows count handler effects.
func setup(t *testing.T) *testBundle {
	t.Helper()
	db := testdb.New(t)
	_, err := db.Pool.Exec(context.Background(),
		`CREATE TABLE payments (id bigserial PRIMARY KEY, event text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)
	return &testBundle{db: db, pool: db.Pool}
}

func newInbox(t *testing.T, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "payments-svc"
	}
	ib, err := inbox.New(cfg)
	require.NoError(t, err)
	return ib
}

func msg(topic string, partition int32, offset int64, value string, headers ...outbox.Header) inbox.Message {
	return inbox.Message{Topic: topic, Partition: partition, Offset: offset, Value: []byte(value), Headers: headers,
		Timestamp: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// pay is a handler whose effect is one payments row.
func pay(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ($1, 100)`, m.String())
	return err
}

func (b *testBundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// begin starts a transaction that is rolled back at cleanup if still open,
// so that a failing test does not hang the pool's Close.
func (b *testBundle) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := b.beginKind(context.Background(), t)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func (b *testBundle) payments(t *testing.T) int { return b.count(t, `SELECT count(*) FROM payments`) }
func (b *testBundle) inboxRows(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM pgbox_inbox`)
}

// process runs one Process in its own committed transaction.
func (b *testBundle) process(t *testing.T, ib *inbox.Inbox, m inbox.Message, h inbox.HandlerFunc) (inbox.Result, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.beginKind(ctx, t)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, perr := process(ctx, ib, tx, m, h)
	require.NoError(t, tx.Commit(ctx))
	return res, perr
}

func TestProcessDuplicateSkipped(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessDuplicateSkipped)
}

func testProcessDuplicateSkipped(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 3, 42, `{"amount":100}`)

	res, err := b.process(t, ib, m, pay)
	require.NoError(t, err)
	require.Equal(t, inbox.Result{Key: "orders/3/42"}, res)

	calls := 0
	res, err = b.process(t, ib, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		calls++
		return pay(ctx, tx, m)
	})
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Equal(t, "orders/3/42", res.Key)
	require.Zero(t, calls)
	require.Equal(t, 1, b.payments(t))
	require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1}, ib.Stats())

	// The row carries what cleanup needs.
	var topic string
	var partition int32
	var offset int64
	var recordAt time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT topic, partition, "offset", record_at FROM pgbox_inbox WHERE consumer = 'payments-svc' AND key = 'orders/3/42'`).
		Scan(&topic, &partition, &offset, &recordAt))
	require.Equal(t, "orders", topic)
	require.EqualValues(t, 3, partition)
	require.EqualValues(t, 42, offset)
	require.True(t, recordAt.Equal(m.Timestamp))
}

func TestProcessRollbackThenRedelivery(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessRollbackThenRedelivery)
}

func testProcessRollbackThenRedelivery(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 0, 7, "v")
	ctx := context.Background()

	tx := b.begin(t)
	res, err := process(ctx, ib, tx, m, pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.NoError(t, tx.Rollback(ctx)) // e.g. a later step failed, or the process crashed
	require.Zero(t, b.inboxRows(t))
	require.Zero(t, b.payments(t))

	res, err = b.process(t, ib, m, pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Equal(t, 1, b.payments(t))
}

func TestProcessHandlerErrorLeavesNothing(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessHandlerErrorLeavesNothing)
}

func testProcessHandlerErrorLeavesNothing(t *testing.T, b *testBundle) {
	ib := newInbox(t, inbox.Config{})
	m := msg("orders", 0, 1, "v")
	ctx := context.Background()
	boom := errors.New("boom")

	tx := b.begin(t)
	_, err := tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('before', 1)`)
	require.NoError(t, err)
	_, err = process(ctx, ib, tx, m, func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := pay(ctx, tx, m); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	var me *inbox.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, "orders/0/1", me.Key)
	// The caller ignores the error, keeps using the transaction, and commits.
	_, err = tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ('after', 1)`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.Zero(t, b.inboxRows(t))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM payments WHERE event IN ('before', 'after')`))
	require.Equal(t, 2, b.payments(t), "the failed handler's write must be rolled back")

	// Redelivery processes it.
	res, err := b.process(t, ib, m, pay)
	require.NoError(t, err)
	require.False(t, res.Duplicate)
	require.Equal(t, 1, b.inboxRows(t))
	require.Equal(t, uint64(1), ib.Stats().HandlerErrors)
}

func TestProcessTwoConsumersOneKey(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessTwoConsumersOneKey)
}

func testProcessTwoConsumersOneKey(t *testing.T, b *testBundle) {
	a := newInbox(t, inbox.Config{Consumer: "billing", Key: inbox.ByHeader("event-id")})
	c := newInbox(t, inbox.Config{Consumer: "shipping", Key: inbox.ByHeader("event-id")})
	m := msg("orders", 0, 1, "v", outbox.Header{Key: "event-id", Value: []byte("evt-1")})

	for _, ib := range []*inbox.Inbox{a, c} {
		res, err := b.process(t, ib, m, pay)
		require.NoError(t, err)
		require.False(t, res.Duplicate, ib.Consumer())
		require.Equal(t, "evt-1", res.Key)
	}
	for _, ib := range []*inbox.Inbox{a, c} {
		res, err := b.process(t, ib, m, pay)
		require.NoError(t, err)
		require.True(t, res.Duplicate, ib.Consumer())
	}
	require.Equal(t, 2, b.payments(t))
	require.Equal(t, 2, b.inboxRows(t))
}

func TestProcessInvalidMessage(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessInvalidMessage)
}

func testProcessInvalidMessage(t *testing.T, b *testBundle) {
	ctx := context.Background()
	byHeader := newInbox(t, inbox.Config{Key: inbox.ByHeader("event-id")})
	byOffset := newInbox(t, inbox.Config{})
	hdr := func(v string) outbox.Header { return outbox.Header{Key: "event-id", Value: []byte(v)} }

	cases := []struct {
		name string
		ib   *inbox.Inbox
		m    inbox.Message
		want string // in the error text
	}{
		{"empty topic", byOffset, msg("", 0, 1, "v"), "empty topic"},
		{"non-UTF-8 topic", byOffset, msg("a\xffb", 0, 1, "v"), "not valid UTF-8"},
		{"negative partition", byOffset, msg("orders", -1, 1, "v"), "negative partition -1"},
		{"negative offset", byOffset, msg("orders", 0, -5, "v"), "negative offset -5"},
		{"missing header", byHeader, msg("orders", 0, 1, "v"), `missing header "event-id"`},
		{"empty header", byHeader, msg("orders", 0, 1, "v", hdr("")), `header "event-id" is empty`},
		{"over-long key", byHeader, msg("orders", 0, 1, "v", hdr(strings.Repeat("k", inbox.MaxKeyLen+1))), "longer than MaxKeyLen"},
		{"non-UTF-8 key", byHeader, msg("orders", 0, 1, "v", hdr("evt\xff")), "not valid UTF-8"},
		{"NUL in key", byHeader, msg("orders", 0, 1, "v", hdr("evt\x00")), "NUL"},
		{"empty func key", newInbox(t, inbox.Config{Key: inbox.ByFunc(func(m inbox.Message) (string, error) { return okOr(m, "", nil) })}),
			msg("orders", 0, 1, "v"), "empty key"},
		{"func error", newInbox(t, inbox.Config{Key: inbox.ByFunc(func(m inbox.Message) (string, error) { return okOr(m, "", errors.New("no order id")) })}),
			msg("orders", 0, 1, "v"), "no order id"},
	}
	for _, tc := range cases {
		tx := b.begin(t)
		called := false
		_, err := process(ctx, tc.ib, tx, tc.m, func(context.Context, pgx.Tx, inbox.Message) error { called = true; return nil })
		require.ErrorIs(t, err, inbox.ErrInvalidMessage, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, fmt.Sprintf("message %s", tc.m), tc.name) // names the message
		require.False(t, called, tc.name)
		// The transaction is still usable, and commits nothing of the message.
		_, err = tx.Exec(ctx, `INSERT INTO payments (event, amount) VALUES ($1, 1)`, tc.name)
		require.NoError(t, err, tc.name)
		require.NoError(t, tx.Commit(ctx), tc.name)
		require.Zero(t, b.inboxRows(t), tc.name)
	}
	require.Equal(t, len(cases), b.payments(t))

	// The same inputs in a batch, after a valid message: nothing of the batch stays.
	for _, tc := range cases {
		tx := b.begin(t)
		ok := msg("orders", 9, 9, "v", hdr("fine"))
		_, err := processBatch(ctx, tc.ib, tx, []inbox.Message{ok, tc.m}, pay)
		require.ErrorIs(t, err, inbox.ErrInvalidMessage, tc.name)
		var me *inbox.MessageError
		require.ErrorAs(t, err, &me, tc.name)
		require.Equal(t, 1, me.Index, tc.name)
		_, err = tx.Exec(ctx, `SELECT 1`)
		require.NoError(t, err, tc.name)
		require.NoError(t, tx.Commit(ctx), tc.name)
		require.Zero(t, b.inboxRows(t), tc.name)
	}
	require.Equal(t, len(cases), b.payments(t))
}

// okOr keys the batch tests' valid message (partition 9) as "fine".
func okOr(m inbox.Message, key string, err error) (string, error) {
	if m.Partition == 9 {
		return "fine", nil
	}
	return key, err
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  inbox.Config
		want string
	}{
		{inbox.Config{}, "Config.Consumer is empty"},
		{inbox.Config{Consumer: strings.Repeat("c", inbox.MaxConsumerLen+1)}, "longer than MaxConsumerLen"},
		{inbox.Config{Consumer: "c\xff"}, "not valid UTF-8"},
		{inbox.Config{Consumer: "c", Key: inbox.ByFunc(nil)}, "nil func"},
		{inbox.Config{Consumer: "c", Key: inbox.ByHeader("")}, `ByHeader(""), an empty header name: name the header`},
		{inbox.Config{Consumer: "c", Key: inbox.ByHeader(""), Dedup: inbox.DedupWatermarkAndKeys}, `ByHeader(""), an empty header name`},
		{inbox.Config{Consumer: "c", Key: inbox.ByOffset(), Dedup: inbox.DedupWatermark}, "DedupWatermark, which uses no key"},
		{inbox.Config{Consumer: "c", Dedup: inbox.DedupWatermarkAndKeys}, "DedupWatermarkAndKeys needs Config.Key"},
		{inbox.Config{Consumer: "c", Dedup: inbox.Dedup(7)}, "not a known mode"},
		{inbox.Config{Consumer: "c", LockTimeout: -time.Second}, "LockTimeout is negative"},
	} {
		_, err := inbox.New(tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
	ib, err := inbox.New(inbox.Config{Consumer: "c"})
	require.NoError(t, err)
	require.Equal(t, "c", ib.Consumer())
}

// TestProcessManyInOneTx checks the savepoints Process leaves open: a failing
// handler later in the transaction rolls back only its own message, and a
// caller's savepoint around Process still rolls back all of it.
func TestProcessManyInOneTx(t *testing.T) {
	t.Parallel()
	forKinds(t, testProcessManyInOneTx)
}

func testProcessManyInOneTx(t *testing.T, b *testBundle) {
	ctx := context.Background()
	ib := newInbox(t, inbox.Config{})
	boom := errors.New("boom")
	fail := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if err := pay(ctx, tx, m); err != nil {
			return err
		}
		return boom
	}

	tx := b.begin(t)
	_, err := process(ctx, ib, tx, msg("orders", 0, 1, "v"), pay)
	require.NoError(t, err)
	_, err = process(ctx, ib, tx, msg("orders", 0, 2, "v"), fail)
	require.ErrorIs(t, err, boom)
	res, err := process(ctx, ib, tx, msg("orders", 0, 1, "v"), pay) // seen earlier in this tx
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	_, err = process(ctx, ib, tx, msg("orders", 0, 3, "v"), pay)
	require.NoError(t, err)

	// A caller's own savepoint around Process, rolled back.
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = process(ctx, ib, sp, msg("orders", 0, 4, "v"), pay)
	require.NoError(t, err)
	require.NoError(t, sp.Rollback(ctx))
	// And one released.
	sp, err = tx.Begin(ctx)
	require.NoError(t, err)
	_, err = process(ctx, ib, sp, msg("orders", 0, 5, "v"), pay)
	require.NoError(t, err)
	require.NoError(t, sp.Commit(ctx))
	_, err = process(ctx, ib, tx, msg("orders", 0, 6, "v"), fail)
	require.ErrorIs(t, err, boom)
	require.NoError(t, tx.Commit(ctx))

	var keys []string
	rows, err := b.pool.Query(ctx, `SELECT key FROM pgbox_inbox ORDER BY key`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"orders/0/1", "orders/0/3", "orders/0/5"}, keys)
	require.Equal(t, 3, b.payments(t))
}
