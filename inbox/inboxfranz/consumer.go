package inboxfranz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
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
	cl    *kgo.Client
	loop  *consume.Loop
	cfg   Config
	log   *slog.Logger
	group string

	ran     atomic.Bool
	closing atomic.Bool // Close was called: a revocation commits nothing more

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
// kgo.ConsumerGroup, kgo.ConsumeTopics. The Consumer commits each offset
// itself, only after the transaction of its record committed, so it adds
// kgo.DisableAutoCommit to opts (passing it too is harmless):
//
//	BEGIN; ib.Process(msg, fn) or ib.ProcessBatch(msgs, fn); COMMIT; mark; commit the offset
//
// fn gets the transaction: its business writes, and outbox.Write calls for the
// events it produces, commit together with the inbox key, so a redelivered
// record is skipped as a duplicate. Errors are handled as inboxsarama's
// NewHandler handles them (the two adapters share one loop): retryable
// database errors retry uncounted, errors that need an operator end Run,
// handler errors count as attempts and are dead-lettered after
// Config.MaxAttempts (at once for inbox.Permanent). With Config.BatchHandler
// set, fn must be nil and each batch goes to the batch handler at once, as
// with inboxsarama.
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
// migration), pass a balancer both offer, kgo.Balancers(kgo.RangeBalancer()):
// kgo's default (cooperative-sticky) shares none with sarama's, so the group
// never forms, and Run logs that once at ERROR and returns an error wrapping
// kerr.InconsistentGroupProtocol.
//
// It refuses, naming the setting: a nil pool, inbox or fn, no
// kgo.ConsumerGroup, an invalid Config, and options that ask for the
// autocommit the Consumer turns off (kgo.GreedyAutoCommit,
// kgo.AutoCommitMarks, an kgo.AutoCommitInterval other than kgo's default:
// use Config.CommitInterval or Config.CommitOffsets).
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
	if cfg.LeaveTimeout == 0 {
		cfg.LeaveTimeout = LeaveTimeoutDefault
	}
	c := &Consumer{
		loop: loop, cfg: cfg, log: loop.Config().Logger,
		parts: map[tp]*part{}, marks: map[tp]*mark{},
		fatal: make(chan error, 1),
	}
	all := append(append([]kgo.Opt(nil), opts...),
		// Offsets are committed by the Consumer, after each transaction.
		kgo.DisableAutoCommit(),
		// A poll and the queuing of its records is one step to a
		// rebalance: records polled before a revocation are never
		// queued after it (AllowRebalance follows each poll at once).
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { c.revoke(ctx, m, true) }),
		kgo.OnPartitionsLost(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { c.revoke(ctx, m, false) }),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		// kgo refuses group settings without kgo.ConsumerGroup, and
		// autocommit modes beside kgo.DisableAutoCommit, itself.
		return nil, fmt.Errorf("inboxfranz: NewConsumer: %w (the Consumer needs a group consumer, kgo.ConsumerGroup(name) and kgo.ConsumeTopics(...), "+
			"and commits offsets itself: leave out kgo.GreedyAutoCommit and kgo.AutoCommitMarks)", err)
	}
	if err := checkClient(cl); err != nil {
		cl.Close()
		return nil, err
	}
	c.cl = cl
	c.group, _ = cl.OptValue(kgo.ConsumerGroup).(string)
	return c, nil
}

// checkClient refuses client settings that would break the guarantees.
func checkClient(cl *kgo.Client) error {
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return errors.New("inboxfranz: NewConsumer: no consumer group: pass kgo.ConsumerGroup(name) (offsets are committed to a group)")
	}
	if d, _ := cl.OptValue(kgo.AutoCommitInterval).(time.Duration); d != kgoAutoCommitInterval {
		return fmt.Errorf("inboxfranz: NewConsumer: kgo.AutoCommitInterval(%v) asks for autocommit, which the Consumer turns off "+
			"(it commits each offset after its transaction): leave it out and set Config.CommitInterval instead", d)
	}
	return nil
}

// kgoAutoCommitInterval is kgo's default kgo.AutoCommitInterval: any other
// value was set by the caller (TestNewConsumerAutocommit keeps it true).
const kgoAutoCommitInterval = 5 * time.Second

// Client is the kgo client the Consumer consumes with (to read its
// settings, or to produce): do not poll it, commit with it or close it.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Stats returns the counters so far.
func (c *Consumer) Stats() inbox.ConsumerStats { return c.loop.Stats() }

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
		if errors.Is(err, kerr.InconsistentGroupProtocol) {
			c.noCommonBalancer(ctx, cancel, err)
			return
		}
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

// noCommonBalancer ends Run: the group's members share no balancer (kgo's
// default, cooperative-sticky, beside sarama members offering range), so
// this member can never join, and kgo would retry the join forever.
func (c *Consumer) noCommonBalancer(ctx context.Context, cancel context.CancelFunc, err error) {
	err = fmt.Errorf("inboxfranz: the group's members share no partition balancer, so this member cannot join (sarama members offer range by default; "+
		"pass kgo.Balancers(kgo.RangeBalancer()), or another balancer every member offers): %w", err)
	select {
	case c.fatal <- err:
		c.log.ErrorContext(ctx, "pgbox: consumer group has no balancer in common, ending Run: pass kgo.Balancers(kgo.RangeBalancer())",
			"group", c.group, "error", err)
		cancel()
	default: // Run is ending already
	}
}

// Close leaves the group and closes the client. Call it after Run returned
// (Run committed the offsets of committed transactions). It waits at most
// Config.LeaveTimeout for the group to be left (see there), so it returns
// within that bound even while a rebalance is under way or the broker does
// not answer.
func (c *Consumer) Close() {
	c.closing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaveTimeout)
	defer cancel()
	// Past the bound kgo stops waiting and gives the leave up; Close then
	// returns at once (kgo.Client.Close waits for a leave only once).
	if err := c.cl.LeaveGroupContext(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.log.WarnContext(ctx, "pgbox: leaving the consumer group failed (the group notices after its session timeout)", "error", err)
	} else if err != nil {
		c.log.WarnContext(ctx, "pgbox: leaving the consumer group timed out (the group notices after its session timeout)",
			"leave_timeout", c.cfg.LeaveTimeout)
	}
	c.cl.Close()
}
