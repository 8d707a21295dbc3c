package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
)

// Permanent is the one way, for both consumer adapters, to mark a handler
// error as one retrying cannot fix; the mark survives wrapping and keeps the
// cause.
func TestPermanent(t *testing.T) {
	t.Parallel()
	require.NoError(t, inbox.Permanent(nil))
	base := errors.New("bad payload")
	err := fmt.Errorf("handler: %w", inbox.Permanent(base))
	require.ErrorIs(t, err, inbox.ErrPermanent)
	require.ErrorIs(t, err, base)
	require.Equal(t, "handler: bad payload", err.Error())
	require.NotErrorIs(t, base, inbox.ErrPermanent)
	require.ErrorIs(t, inbox.Permanent(context.DeadlineExceeded), context.DeadlineExceeded)
}
