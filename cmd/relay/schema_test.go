package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// `relay run` refuses a schema missing the newest migration (the console's
// tables, once) at start, naming the fix, instead of starting and failing
// when the missing part is first used.
func TestRunRefusesSchemaMissingNewestMigration(t *testing.T) {
	t.Parallel()
	db, c := testdb.New(t), kafkatest.New(t)
	env := runEnv(db, c, "PGBOX_CONSOLE_ADDR=127.0.0.1:0")
	r := runRelay(t, time.Minute, env, "migrate", "down")
	require.Equal(t, 0, r.Code, r.Stderr)
	r = runRelay(t, time.Minute, env, "run")
	require.Equal(t, 1, r.Code, r.Stderr)
	require.Contains(t, r.Stderr, "relay migrate up")
	require.Contains(t, r.Stderr, newestMigration(t))
}
