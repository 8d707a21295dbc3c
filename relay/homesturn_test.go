package relay_test

// Hostile review of 81527e6 (homes.go: a target waits for its home's
// connection while a home-mate's statement has had it less than homeTurn,
// 250 ms): end-to-end attacks through a Fleet. White-box part:
// homesturn_internal_test.go.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/relay"
)

// Attack: a target whose statements are steadily slow, each just under
// homeTurn: its outbox is locked for 200 ms at a time, again and again
// (5 ms apart), while rows keep coming to it, so its claims run one after
// another, each holding its home's connection about 200 ms. Its home-mates
// wait for that connection (homeTurn at most, if the wait is bounded) on
// every statement they run, rather than taking the pool's at once.
//
// Must hold: the other targets' rows, written steadily for 4 s, all reach
// Kafka in per-key order within 10 s of the last write; the time it took
// is logged (compare with d2281b0, which went to the pool at once).
func TestHomesTurnSteadilySlowHomeMate(t *testing.T) {
	c := kafkatest.New(t)
	addrs := c.ListenAddrs()
	decoy := testdb.New(t)
	pool := haPool(t, decoy, pgx.QueryExecModeCacheStatement, 4, "ha-turn")
	slow := testdb.New(t)
	kafkatest.CreateTopic(t, addrs, "slow", 3, nil)
	targets := []relay.Target{{Name: "slow", Pool: pool, Schema: slow.Schema}}
	const others = 3
	var dbs []*testdb.DB
	for i := range others {
		db := testdb.New(t)
		dbs = append(dbs, db)
		kafkatest.CreateTopic(t, addrs, topicOf(i), 3, nil)
		targets = append(targets, relay.Target{Name: topicOf(i), Pool: pool, Schema: db.Schema})
	}
	f, err := relay.NewFleet(relay.FleetConfig{Relay: faConfig(addrs, "ha-turn"), Targets: targets, DormantAfter: -1})
	require.NoError(t, err)
	runFleet(t, f)
	waitAllLanes(t, f)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // the slow target's rows, and its outbox locked 200 ms at a time
		locker, err := pgx.Connect(ctx, testdb.ServerURL(t))
		if err != nil {
			return
		}
		defer locker.Close(context.Background())
		s := pgx.Identifier{slow.Schema}.Sanitize()
		for n := 0; ctx.Err() == nil; n += 5 {
			haWrite(t, slow, "slow", n, 5, true)
			_ = pgx.BeginFunc(ctx, locker, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, fmt.Sprintf("LOCK TABLE %s.pgbox_outbox IN ACCESS EXCLUSIVE MODE", s)); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "SELECT pg_sleep(0.2)")
				return err
			})
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(time.Second)
	const rounds, per = 40, 5
	for r := range rounds {
		for i, db := range dbs {
			haWrite(t, db, topicOf(i), r*per, per, true)
		}
		time.Sleep(100 * time.Millisecond)
	}
	last := time.Now()
	var problems []string
	for i := range dbs {
		if _, p := haExpect(t, addrs, topicOf(i), rounds*per, 10*time.Second); p != "" {
			problems = append(problems, p)
		}
	}
	t.Logf("the other targets' rows were all on Kafka %s after the last write", time.Since(last).Round(time.Millisecond))
	require.Empty(t, problems, "targets sharing homes with a target whose statements each take 200 ms must keep publishing")
}
