package relay

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/testutil"
)

// A writer that sets a keyed row's slot itself, and gets it wrong, is
// named at ERROR (its key's rows may sit in two lanes and overtake each
// other); the row is published all the same.
func TestWrongSlotIsLogged(t *testing.T) {
	t.Parallel()
	b := newFloorBundle(t)
	var logs testutil.SyncBuffer
	b.r.log = slog.New(slog.NewTextHandler(&logs, nil))
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `INSERT INTO pgbox_outbox (slot, topic, key, value)
		VALUES ((pgbox_outbox_slot('order-1', NULL) + 1) % 256, 't', 'order-1', 'v') RETURNING id`).Scan(&id))
	require.Equal(t, []int64{id}, b.drain(), "published all the same")
	require.Contains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), "an outbox row's slot is not its key's")
	require.Contains(t, logs.String(), fmt.Sprintf("row_id=%d", id))
}
