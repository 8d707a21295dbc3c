package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// waitLiveRows waits until the statistics show db's outbox holding n rows
// (what the relay's start reads to order its checks).
func waitLiveRows(t *testing.T, db *testdb.DB, n int64) {
	t.Helper()
	waitFor(t, "the statistics show the rows", 30*time.Second, func() bool {
		var live int64
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'pgbox_outbox'`, db.Schema).Scan(&live))
		return live >= n
	})
}

// logAt is where re first matches out (-1: nowhere).
func logAt(out, re string) int {
	loc := regexp.MustCompile(re).FindStringIndex(out)
	if loc == nil {
		return -1
	}
	return loc[0]
}

// After a restart the targets whose outbox holds rows start alone: the
// others are checked and started once those have caught up, so a thousand
// idle targets do not take the drain's CPU.
func TestRunTargetsBacklogFirst(t *testing.T) {
	t.Parallel()
	big, idle1, idle2 := testdb.New(t), testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-big", "t-idle"))
	writeRows(t, big, "t-big", 0, 3000)
	waitLiveRows(t, big, 3000)
	file := writeFile(t, "targets.txt", "idle1 "+idle1.Schema+"\nbig "+big.Schema+"\nidle2 "+idle2.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_BATCH_SIZE=500"), "run")
	require.Len(t, eventIDs(t, c, "t-big", 3000), 3000)
	waitFor(t, "every target started", 20*time.Second, func() bool {
		out := p.Output()
		return logAt(out, `msg="relay started"[^\n]*target=idle1 `) >= 0 && logAt(out, `msg="relay started"[^\n]*target=idle2 `) >= 0
	})
	out := p.Output()
	bigStarted := logAt(out, `msg="relay started"[^\n]*target=big `)
	caught := logAt(out, `msg="targets with rows caught up: checking the others" component=targets targets=1 `)
	require.NotEqual(t, -1, bigStarted, out)
	require.NotEqual(t, -1, caught, out)
	require.Less(t, bigStarted, caught, out)
	for _, name := range []string{"idle1", "idle2"} {
		at := logAt(out, `msg="relay started"[^\n]*target=`+name+` `)
		require.Greater(t, at, caught, "%s started before the backlog caught up:\n%s", name, out)
	}
	writeRows(t, idle1, "t-idle", 0, 5)
	require.Len(t, eventIDs(t, c, "t-idle", 5), 5)
	require.Equal(t, 0, p.stop(t), p.Output())
}

// A backlog that takes longer than backlogFirstFor to drain (a broker that
// takes 250 ms over each produce request of its topic) holds the other targets back for
// backlogFirstFor only: they start beside it, and rows written to them go
// out while it still drains.
func TestRunTargetsBacklogFirstBounded(t *testing.T) {
	t.Parallel()
	big, idle := testdb.New(t), testdb.New(t)
	c := kafkatest.New(t, kfake.SeedTopics(2, "t-big", "t-idle"))
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			if tp.Topic == "t-big" {
				time.Sleep(250 * time.Millisecond)
			}
		}
		return nil, nil, false
	})
	writeRows(t, big, "t-big", 0, 10000)
	waitLiveRows(t, big, 10000)
	file := writeFile(t, "targets.txt", "big "+big.Schema+"\nidle "+idle.Schema+"\n")
	p := startRelay(t, fleetEnv(t, c, "PGBOX_TARGETS="+file, "PGBOX_BATCH_SIZE=100"), "run")
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(p.Output())
		}
	})
	waitFor(t, "the others checked beside the backlog", 30*time.Second, func() bool {
		return strings.Contains(p.Output(), `msg="targets with rows still draining: checking the others beside them" component=targets draining=1 waited=5`)
	})
	writeRows(t, idle, "t-idle", 0, 5)
	require.Len(t, eventIDs(t, c, "t-idle", 5), 5)
	var left int
	require.NoError(t, big.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_outbox`).Scan(&left))
	require.Positive(t, left, "the backlog had drained: the test proves nothing")
	require.Equal(t, 0, p.stop(t), p.Output())
}
