package consume

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
)

// An adapter takes a per-message handler or Config.BatchHandler: neither,
// and both, are refused with an error that names the setting.
func TestHandlerOf(t *testing.T) {
	t.Parallel()
	fn := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	bfn := func(context.Context, pgx.Tx, []inbox.Message) error { return nil }
	cfg := Config{Name: "inboxsarama"}
	require.ErrorContains(t, handlerOf(nil, cfg, "NewHandler"), "inboxsarama: NewHandler: nil HandlerFunc (pass the func that does each message's business work, or set Config.BatchHandler")
	require.NoError(t, handlerOf(fn, cfg, "NewHandler"))
	cfg.BatchHandler = bfn
	require.NoError(t, handlerOf(nil, cfg, "NewHandler"))
	require.ErrorContains(t, handlerOf(fn, cfg, "NewHandler"), "both a HandlerFunc and Config.BatchHandler are set")
}
