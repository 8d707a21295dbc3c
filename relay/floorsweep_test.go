package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
	"github.com/pgbox/pgbox/outbox"
)

// The second line of defence: a test hook breaks the floor's rule on
// purpose (after every move, each established floor jumps far past every
// id), so claims from the floors find nothing; the sweep (every
// SweepInterval, from each slot's start) publishes every row, each key in
// order, counts them in RowsBelowFloor and logs an ERROR. 0 lost.
func TestFloorSweepCatchesABrokenRule(t *testing.T) {
	ctx := context.Background()
	db := testdb.New(t)
	cluster := kafkatest.New(t, kfake.SeedTopics(3, "events"))
	kc := kafkatest.Config()
	kc.Producer.Idempotent = true
	kc.Producer.RequiredAcks = sarama.WaitForAll
	kc.Net.MaxOpenRequests = 1
	kc.Producer.Return.Successes = true
	logs := &testutil.SyncBuffer{}
	r, err := New(Config{Pool: db.Pool, Brokers: cluster.ListenAddrs(), Kafka: kc, Instance: "sweep", Lanes: 4,
		HeartbeatInterval: 100 * time.Millisecond, LeaseTTL: time.Second, PollInterval: 100 * time.Millisecond,
		SweepInterval: time.Second, Channel: "pgbox_" + db.Schema,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	require.NoError(t, err)
	r.floors.hook = func(f *floorState) {
		for s := range f.floor {
			if f.epoch[s] != 0 {
				f.floor[s] = 1 << 40
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	// Let the hook break every floor first, then write.
	time.Sleep(time.Second)
	const keys, perKey = 20, 10
	for v := range perKey {
		var msgs []outbox.Message
		for k := range keys {
			msgs = append(msgs, outbox.Message{Topic: "events", Key: fmt.Appendf(nil, "k-%d", k), Value: fmt.Appendf(nil, "%d", v)})
		}
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, msgs...) }))
		time.Sleep(50 * time.Millisecond)
	}
	got := kafkatest.ReadAll(t, cluster.ListenAddrs(), "events", keys*perKey, 30*time.Second)
	seen := map[string]bool{}
	per := map[string][]string{}
	for _, m := range got {
		var id string
		for _, h := range m.Headers {
			if string(h.Key) == EventIDHeader {
				id = string(h.Value)
			}
		}
		if !seen[id] {
			seen[id] = true
			per[string(m.Key)] = append(per[string(m.Key)], string(m.Value))
		}
	}
	want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	for k := range keys {
		require.Equal(t, want, per[fmt.Sprintf("k-%d", k)], "key k-%d: every row, in order", k)
	}
	require.Positive(t, r.Stats().RowsBelowFloor, "the sweep counted the rows the broken rule let pass")
	require.Contains(t, logs.String(), "level=ERROR")
	require.True(t, strings.Contains(logs.String(), "below their slot's floor"), "the ERROR says what happened")
}
