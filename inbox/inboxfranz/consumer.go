package inboxfranz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/consume"
)

// pollMax bounds the records one poll hands out.
const pollMax = 10000

// Consumer is a franz-go group consumer that runs every record through an
// inbox. NewConsumer makes one; Run consumes until its ctx ends; Close
// leaves the group.
type Consumer struct {
	cl   *kgo.Client
	loop *consume.Loop
	cfg  Config
	log  *slog.Logger

	ran atomic.Bool

	// mu guards parts and marks.
	mu    sync.Mutex
	parts map[tp]*part
	marks map[tp]*mark

	// commitMu serializes commits, so that no commit of a partition's
	// offset goes out after its revocation finished.
	commitMu sync.Mutex

	fatal chan error // the first error that needs an operator
}

type tp struct {
	topic     string
	partition int32
}

// NewConsumer returns a Consumer over a new kgo client built from opts, which
// name the brokers, the group and its topics: kgo.SeedBrokers,
// kgo.ConsumerGroup, kgo.ConsumeTopics, and kgo.DisableAutoCommit, because
// the Consumer commits each offset itself, only after the transaction of
// its record committed:
//
//	BEGIN; ib.Process(msg, fn) or ib.ProcessBatch(msgs, fn); COMMIT; mark; commit the offset
//
// fn gets the transaction: its business writes, and outbox.Write calls for the
// events it produces, commit together with the inbox key, so a redelivered
// record is skipped as a duplicate. Errors are handled as inboxsarama's
// NewHandler handles them (the two adapters share one loop): retryable
// database errors retry uncounted, errors that need an operator end Run,
// handler errors count as attempts and are dead-lettered after
// Config.MaxAttempts (at once for Permanent). With Config.BatchHandler set,
// fn must be nil and each batch goes to the batch handler at once, as with
// inboxsarama.
//
// The Consumer installs kgo.OnPartitionsRevoked, kgo.OnPartitionsLost and
// kgo.BlockRebalanceOnPoll (opts must not rely on their own hooks; the
// Consumer allows rebalances again as soon as a poll's records are queued,
// not after they are processed, so a record retried for minutes never holds
// a rebalance): a revoked partition's transaction in
// flight may commit within Config.DrainTimeout, its committed offsets are
// committed to Kafka, and only then does the rebalance go on; an offset past
// what committed in PostgreSQL is never committed. Both eager and
// cooperative balancers work; in a group shared with sarama members (a
// migration), use a balancer both offer, such as kgo.RangeBalancer.
//
// It refuses, naming the setting: a nil pool, inbox or fn, a client whose
// autocommit is on (no kgo.DisableAutoCommit), no kgo.ConsumerGroup, and
// an invalid Config.
func NewConsumer(pool *pgxpool.Pool, ib *inbox.Inbox, fn inbox.HandlerFunc, cfg Config, opts ...kgo.Opt) (*Consumer, error) {
	loop, err := consume.New(pool, ib, fn, cfg.core(), "NewConsumer")
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = CommitIntervalDefault
	}
	c := &Consumer{
		loop: loop, cfg: cfg, log: loop.Config().Logger,
		parts: map[tp]*part{}, marks: map[tp]*mark{},
		fatal: make(chan error, 1),
	}
	all := append(append([]kgo.Opt(nil), opts...),
		// A poll and the queuing of its records is one step to a
		// rebalance: records polled before a revocation are never
		// queued after it (AllowRebalance follows each poll at once).
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { c.revoke(ctx, m, true) }),
		kgo.OnPartitionsLost(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { c.revoke(ctx, m, false) }),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		// kgo refuses group settings without kgo.ConsumerGroup itself.
		return nil, fmt.Errorf("inboxfranz: NewConsumer: %w (the Consumer needs a group consumer: kgo.ConsumerGroup(name), kgo.ConsumeTopics(...), kgo.DisableAutoCommit())", err)
	}
	if err := checkClient(cl); err != nil {
		cl.Close()
		return nil, err
	}
	c.cl = cl
	return c, nil
}

// checkClient refuses client settings that would break the guarantees.
func checkClient(cl *kgo.Client) error {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return errors.New("inboxfranz: NewConsumer: no consumer group: pass kgo.ConsumerGroup(name) (offsets are committed to a group)")
	}
	if off, _ := cl.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return errors.New("inboxfranz: NewConsumer: the client's autocommit is on: pass kgo.DisableAutoCommit() " +
			"(autocommit would commit offsets of records whose transaction has not committed; the Consumer commits each offset after its transaction)")
	}
	return nil
}

// Client is the kgo client the Consumer consumes with (to read its
// settings, or to produce): do not poll it, commit with it or close it.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Stats returns the counters so far.
func (c *Consumer) Stats() Stats { return c.loop.Stats() }

// Run consumes until ctx ends (then it returns nil) or a database error that
// needs an operator ends a partition's processing (then it returns that
// error, which wraps inbox.ErrNeedsOperator and names the fix). Before it
// returns, transactions in flight commit or roll back (within
// Config.DrainTimeout) and the committed offsets are committed to Kafka.
// A Consumer runs once: after Run returns, Close it (records read ahead but
// not processed are redelivered to the group's next member) and make a new
// one to go on.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("inboxfranz: Run called twice: a Consumer runs once; Close it and make a new one")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { c.commitEvery(ctx) })
	err := c.poll(ctx, cancel)
	cancel()
	c.stopAll()
	wg.Wait()
	c.commitAll(context.WithoutCancel(ctx))
	return err
}

// poll hands polled records to their partitions' loops until ctx ends or a
// loop fails.
func (c *Consumer) poll(ctx context.Context, cancel context.CancelFunc) error {
	for {
		fs := c.cl.PollRecords(ctx, pollMax)
		c.queue(ctx, cancel, fs)
		c.cl.AllowRebalance()
		select {
		case err := <-c.fatal:
			return err
		default:
		}
		if ctx.Err() != nil {
			return nil
		}
		if fs.IsClientClosed() {
			return errors.New("inboxfranz: the kgo client was closed while Run was running (Close the Consumer only after Run returned)")
		}
	}
}

// queue hands a poll's records to their partitions' loops and logs its
// errors (the client retries fetches itself).
func (c *Consumer) queue(ctx context.Context, cancel context.CancelFunc, fs kgo.Fetches) {
	if ctx.Err() != nil || fs.IsClientClosed() {
		return
	}
	fs.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) {
			c.log.WarnContext(ctx, "pgbox: fetch failed (the client retries)", "topic", topic, "partition", partition, "error", err)
		}
	})
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			c.dispatch(ctx, cancel, p)
		}
	})
}

// Close leaves the group (committing the offsets of committed transactions
// on the way out) and closes the client. Call it after Run returned.
func (c *Consumer) Close() {
	c.cl.Close()
}
