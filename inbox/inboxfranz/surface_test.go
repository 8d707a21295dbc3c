package inboxfranz_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/internal/testutil"
)

// Turning kgo's autocommit off is the Consumer's job: options without
// kgo.DisableAutoCommit are accepted and the client's autocommit is off. Only
// options that ask for autocommit are refused, each naming the option.
func TestNewConsumerAutocommit(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByOffset()})
	require.NoError(t, err)
	// No broker needs to answer: every check runs before the first request.
	base := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("svc"), kgo.ConsumeTopics("events")}
	for _, opts := range [][]kgo.Opt{base, append([]kgo.Opt{kgo.DisableAutoCommit()}, base...)} {
		c, err := inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{}, opts...)
		require.NoError(t, err)
		off, _ := c.Client().OptValue(kgo.DisableAutoCommit).(bool)
		require.True(t, off, "the Consumer turns kgo's autocommit off")
		c.Close()
	}
	for _, tc := range []struct {
		opt  kgo.Opt
		want string
	}{
		{kgo.GreedyAutoCommit(), "kgo.GreedyAutoCommit"},
		{kgo.AutoCommitMarks(), "kgo.AutoCommitMarks"},
		{kgo.AutoCommitInterval(3 * time.Second), "Config.CommitInterval"},
	} {
		c, err := inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{}, append([]kgo.Opt{tc.opt}, base...)...)
		require.ErrorContains(t, err, tc.want)
		require.ErrorContains(t, err, "inboxfranz: NewConsumer")
		require.Nil(t, c)
	}
	_, err = inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{LeaveTimeout: -time.Second}, base...)
	require.ErrorContains(t, err, "Config.LeaveTimeout is negative")
}

// Close waits at most Config.LeaveTimeout for the group to be left. The
// broker here never answers LeaveGroup; kgo alone would wait out its request
// timeout and retry. Close returns while the first LeaveGroup is still
// unanswered, and no second one was ever sent. (The bound is shown by order,
// not by a measured time.)
func TestCloseBoundsTheLeave(t *testing.T) {
	t.Parallel()
	w := consumetest.Setup(t, 1)
	w.ProduceEvents(t, consumetest.Events("e", 3)...)
	ib := consumetest.NewInbox(t, "svc", inbox.ByHeader(consumetest.EventHeader))
	c, err := inboxfranz.NewConsumer(w.DB.Pool, ib, consumetest.Effect,
		inboxfranz.Config{LeaveTimeout: time.Second},
		kgo.SeedBrokers(w.Addrs...), kgo.ConsumerGroup("svc"), kgo.ConsumeTopics(w.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	testutil.Eventually(t, 60*time.Second, "three processed", func() bool { return c.Stats().Processed == 3 })
	cancel()
	require.NoError(t, <-ran)

	var leaves atomic.Int32
	w.Kafka.ControlKey(int16(kmsg.LeaveGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		w.Kafka.KeepControl()
		leaves.Add(1)
		return nil, nil, true // handled, never answered: the client waits
	})
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Minute): // liveness only: without the bound, kgo waits and retries
		t.Fatal("Close did not return")
	}
	require.EqualValues(t, 1, leaves.Load(), "Close returned while the first LeaveGroup was unanswered, without a retry")
}

// A franz-go member left on kgo's default balancer (cooperative-sticky) in a
// group whose sarama member offers range can never join. Run logs that once,
// at ERROR, naming the option to pass, and returns an error wrapping
// kerr.InconsistentGroupProtocol instead of retrying forever.
func TestRunEndsWhenNoBalancerIsShared(t *testing.T) {
	t.Parallel()
	w := consumetest.Setup(t, 2)
	w.ProduceEvents(t, consumetest.Events("e", 4)...)
	ib := consumetest.NewInbox(t, "svc", inbox.ByHeader(consumetest.EventHeader))

	// The sarama member (range, sarama's default) forms the group first.
	h, err := inboxsarama.NewHandler(w.DB.Pool, ib, consumetest.Effect, inboxsarama.Config{})
	require.NoError(t, err)
	// Generous group timings: the sarama member must stay in the group on a
	// loaded machine (were it dropped, the franz-go member would form the
	// group alone and the sarama one be the member refused).
	cfg := consumetest.GroupConfig()
	cfg.Consumer.Group.Session.Timeout = 60 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = time.Second
	cfg.Consumer.Group.Rebalance.Timeout = 60 * time.Second
	cg, err := sarama.NewConsumerGroup(w.Addrs, "svc", cfg)
	require.NoError(t, err)
	sctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for sctx.Err() == nil {
			_ = cg.Consume(sctx, []string{w.Topic}, h)
		}
	})
	t.Cleanup(func() {
		stop()
		wg.Wait()
		_ = cg.Close()
	})
	testutil.Eventually(t, 60*time.Second, "the sarama member consumed", func() bool { return h.Stats().Processed == 4 })

	var logs testutil.SyncBuffer
	c, err := inboxfranz.NewConsumer(w.DB.Pool, ib, consumetest.Effect,
		inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}},
		kgo.SeedBrokers(w.Addrs...), kgo.ConsumerGroup("svc"), kgo.ConsumeTopics(w.Topic),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	require.NoError(t, err)
	defer c.Close()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	select {
	case err = <-ran:
	case <-time.After(2 * time.Minute): // liveness only: without the check, Run never returns
		t.Fatal("Run did not end")
	}
	require.ErrorIs(t, err, kerr.InconsistentGroupProtocol)
	require.ErrorContains(t, err, "kgo.Balancers(kgo.RangeBalancer())")
	var errorLines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "level=ERROR") {
			errorLines = append(errorLines, l)
		}
	}
	require.Len(t, errorLines, 1, "logged once: %v", errorLines)
	require.Contains(t, errorLines[0], "kgo.Balancers(kgo.RangeBalancer())")
	require.NotContains(t, logs.String(), "the client retries", "no endless warnings")
}
