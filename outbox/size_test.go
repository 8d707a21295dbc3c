package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// RecordSize counts key, value, every header with its length prefixes, the
// relay's own two headers and the record and batch overhead.
func TestRecordSizeCountsEverything(t *testing.T) {
	t.Parallel()
	base := outbox.RecordSize(outbox.Message{Topic: "t"})
	// 49 batch + 36 record + (14+36+10) event id + (16+30+10) created at.
	require.Equal(t, 49+36+60+56, base)
	m := outbox.Message{Topic: "t", Key: []byte("key"), Value: []byte("value"), Headers: []outbox.Header{{Key: "h", Value: []byte("vv")}}}
	require.Equal(t, base+3+5+(1+2+10), outbox.RecordSize(m))
}

// A message exactly at the limit is written; one byte over is rejected with
// an error naming the size, the limit and the settings, nothing is written
// and the caller's transaction stays usable.
func TestWriteSizeLimitBoundary(t *testing.T) {
	t.Parallel()
	forKinds(t, testWriteSizeLimitBoundary)
}

func testWriteSizeLimitBoundary(t *testing.T, db *testdb.DB, k txKind) {
	ctx := context.Background()
	m := outbox.Message{Topic: "payments", Key: []byte("k"), Headers: []outbox.Header{{Key: "trace", Value: []byte("abc")}}}
	m.Value = []byte(strings.Repeat("x", outbox.MaxBytesDefault-outbox.RecordSize(m)))
	require.Equal(t, outbox.MaxBytesDefault, outbox.RecordSize(m))
	over := m
	over.Value = append([]byte("y"), m.Value...)

	tx := begin(t, db, k)
	err := tx.write(ctx, nil, over)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	for _, s := range []string{"record size 1048589 bytes", "limit of 1048588 bytes", "outbox.Config.MaxBytes", "--kafka-max-message-bytes", "message.max.bytes", `topic "payments"`} {
		require.ErrorContains(t, err, s)
	}
	require.NoError(t, tx.write(ctx, nil, m))
	require.Equal(t, 1, tx.rows(t), "only the message at the limit")
	require.NoError(t, tx.commit(ctx))
}
