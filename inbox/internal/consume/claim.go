package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/owntx"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// maxPending bounds the messages read ahead from a claim while a message is
// waiting to be retried (read only to notice a revoked claim).
const maxPending = 1024

// claimRun is the state of one Run: one partition, one session.
type claimRun[R any] struct {
	l     *Loop
	claim Claim[R]

	// work is the context of database work. It outlives the session by up
	// to DrainTimeout, so a transaction in flight at a rebalance can commit.
	work       context.Context
	cancelWork context.CancelFunc
	stopDrain  func() bool

	topicID string
	// attempted holds offsets that have a row in pgbox_consumer_attempts,
	// deleted in the transaction that finally processes them.
	attempted map[int64]struct{}

	// exhausted holds messages whose last allowed attempt ran in a batch
	// that then fell back to one by one: they are dead-lettered, not run again.
	exhausted map[int64]exhausted

	pending []R  // read ahead, not yet handled
	closed  bool // claim.Records() is closed: revoked

	// fatal is the error retrying cannot fix that ended the claim.
	fatal error
}

type exhausted struct {
	cause    error
	attempts int
}

func newClaimRun[R any](l *Loop, claim Claim[R]) *claimRun[R] {
	work, cancel := context.WithCancel(context.WithoutCancel(claim.Context()))
	c := &claimRun[R]{l: l, claim: claim, work: work, cancelWork: cancel, attempted: map[int64]struct{}{}, exhausted: map[int64]exhausted{}}
	c.stopDrain = context.AfterFunc(claim.Context(), func() {
		t := time.AfterFunc(l.cfg.DrainTimeout, cancel)
		context.AfterFunc(work, func() { t.Stop() })
	})
	return c
}

func (c *claimRun[R]) close() {
	c.stopDrain()
	c.cancelWork()
}

// stopped reports whether no new transaction may start: the session ended,
// the drain timeout passed, or the claim was revoked (its Messages channel
// closed, in a cooperative rebalance).
func (c *claimRun[R]) stopped() bool {
	return c.closed || c.claim.Context().Err() != nil || c.work.Err() != nil
}

// run processes the claim until the session ends, the claim is revoked, or
// an error that needs an operator (then in c.fatal) ends it.
func (c *claimRun[R]) run() {
	if !c.start() {
		return
	}
	for {
		batch, ok := c.next()
		if !ok || !c.handle(batch) {
			return
		}
	}
}

// start reads the topic id and the partition's pending attempts, retrying
// until it succeeds or the session ends.
func (c *claimRun[R]) start() bool {
	m := inbox.Message{Topic: c.claim.Topic(), Partition: c.claim.Partition(), Offset: c.claim.InitialOffset()}
	return c.retry(m, "starting the claim", func() (error, error) { return c.load(), nil }, nil)
}

func (c *claimRun[R]) load() error {
	topic, partition := c.claim.Topic(), c.claim.Partition()
	id, err := c.claim.TopicID(c.work)
	if err != nil {
		return err
	}
	c.topicID = id
	rows, err := c.l.pool.Query(c.work, sqlLoadAttempts, c.l.ib.Consumer(), topic, partition, c.claim.InitialOffset(), c.topicID)
	if err != nil {
		return fmt.Errorf("read pgbox_consumer_attempts of %s/%d: %w", topic, partition, err)
	}
	offsets, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("read pgbox_consumer_attempts of %s/%d: %w", topic, partition, err)
	}
	for _, o := range offsets {
		c.attempted[o] = struct{}{}
	}
	return nil
}

// watch is the claim's message channel while read-ahead has room, else nil.
func (c *claimRun[R]) watch() <-chan R {
	if c.closed || len(c.pending) >= maxPending {
		return nil
	}
	return c.claim.Records()
}

// sleep waits d, reading ahead from the claim meanwhile; false when the
// session ended or the claim was revoked.
func (c *claimRun[R]) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-c.claim.Context().Done():
			return false
		case m, ok := <-c.watch():
			if !ok {
				c.closed = true
				return false
			}
			c.pending = append(c.pending, m)
		}
	}
}

// next collects the next batch: the first message blocks, the rest fill up
// to BatchSize from what is buffered or arrives within BatchWait. ok is false
// when the session ended or the claim was revoked.
func (c *claimRun[R]) next() (batch []R, ok bool) {
	size := c.l.cfg.BatchSize
	n := min(size, len(c.pending))
	batch = append(batch, c.pending[:n]...)
	c.pending = c.pending[n:]
	if len(batch) == 0 {
		if c.stopped() {
			return nil, false
		}
		select {
		case <-c.claim.Context().Done():
			return nil, false
		case m, ok := <-c.claim.Records():
			if !ok {
				c.closed = true
				return nil, false
			}
			batch = append(batch, m)
		}
	}
	var timer <-chan time.Time
fill:
	for len(batch) < size && !c.closed {
		// Take what is buffered without waiting...
		select {
		case m, ok := <-c.claim.Records():
			if !ok {
				c.closed = true
				break fill
			}
			batch = append(batch, m)
			continue
		default:
		}
		// ...then wait up to BatchWait for more.
		if timer == nil {
			t := time.NewTimer(c.l.cfg.BatchWait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case m, ok := <-c.claim.Records():
			if !ok {
				c.closed = true
				break fill
			}
			batch = append(batch, m)
		case <-timer:
			break fill
		case <-c.claim.Context().Done():
			return nil, false
		}
	}
	return batch, !c.stopped()
}

// handle processes one batch; false when the claim must stop.
func (c *claimRun[R]) handle(batch []R) bool {
	msgs := make([]inbox.Message, len(batch))
	for i, m := range batch {
		msgs[i] = c.message(m)
	}
	if len(batch) == 1 || c.anyAttempted(msgs) {
		// A message that failed before is processed on its own, so its
		// attempts row is maintained.
		return c.handleEach(batch, msgs)
	}
	return c.retry(msgs[0], fmt.Sprintf("batch of %d", len(msgs)), func() (error, error) {
		var herr error
		var res []inbox.Result
		err := c.inTx(func(tx pgx.Tx) error {
			var err error
			res, err = c.processBatch(tx, msgs, &herr)
			return err
		})
		if err == nil {
			for i, r := range res {
				c.count(msgs[i], r)
			}
			c.claim.Mark(batch[len(batch)-1])
		}
		return err, herr
	}, func(err, herr error, kind errKind) (done, ok bool) {
		if k, cut := c.cutAt(len(msgs), err, herr); cut {
			return true, c.cut(batch, msgs, k, err, kind)
		}
		return true, c.fallBack(batch, msgs, err, herr, kind)
	})
}

func (c *claimRun[R]) anyAttempted(msgs []inbox.Message) bool {
	for _, m := range msgs {
		if _, ok := c.attempted[m.Offset]; ok {
			return true
		}
	}
	return false
}

// fallBack handles a batch that failed because of one of its messages: the
// failed handler run counts as that message's attempt (so MaxAttempts holds in
// batch mode too), and the batch is processed again message by message, so
// one poison message cannot hold back the others.
func (c *claimRun[R]) fallBack(batch []R, msgs []inbox.Message, err, herr error, kind errKind) bool {
	c.l.stats.fallbacks.Add(1)
	c.l.log.WarnContext(c.work, "pgbox: batch failed, processing its messages one by one",
		"topic", msgs[0].Topic, "partition", msgs[0].Partition, "first_offset", msgs[0].Offset,
		"size", len(msgs), "error", err)
	var me *inbox.MessageError
	if herr != nil && errors.As(err, &me) && me.Index >= 0 && me.Index < len(msgs) && !c.batchAttempt(msgs[me.Index], err, kind) {
		return false
	}
	return c.handleEach(batch, msgs)
}

// countAttempt records a failed attempt of m, retrying database errors;
// attempts is 0 when recording failed in a way the next run of the message
// will retry, ok false when the claim must stop.
func (c *claimRun[R]) countAttempt(m inbox.Message, cause error) (attempts int, ok bool) {
	attempts, err := c.recordAttempt(m, cause)
	if err == nil {
		c.attempted[m.Offset] = struct{}{}
		return attempts, true
	}
	if c.work.Err() != nil {
		return 0, false
	}
	return 0, c.infraError(infraKind(err), m, 1, err, "recording the attempt")
}

func (c *claimRun[R]) handleEach(batch []R, msgs []inbox.Message) bool {
	for i, m := range batch {
		if !c.handleOne(m, msgs[i]) {
			return false
		}
	}
	return true
}

// handleOne processes one message until it commits or is dead-lettered;
// false when the claim must stop.
func (c *claimRun[R]) handleOne(sm R, m inbox.Message) bool {
	if x, ok := c.exhausted[m.Offset]; ok {
		// Its last allowed attempt ran in a batch.
		delete(c.exhausted, m.Offset)
		return c.deadLetter(sm, m, x.cause, x.attempts)
	}
	return c.retry(m, "message", func() (error, error) {
		res, err, herr := c.processOne(m)
		if err == nil {
			delete(c.attempted, m.Offset)
			c.count(m, res)
			c.claim.Mark(sm)
		}
		return err, herr
	}, func(err, _ error, kind errKind) (done, ok bool) {
		return c.failed(sm, m, err, kind)
	})
}

// processOne runs one transaction: Process, and the deletion of m's attempts
// row once it succeeded. herr is the handler's own error.
func (c *claimRun[R]) processOne(m inbox.Message) (res inbox.Result, err, herr error) {
	_, hadAttempts := c.attempted[m.Offset]
	err = c.inTx(func(tx pgx.Tx) error {
		var err error
		res, err = c.processOneIn(tx, m, &herr)
		if err == nil && hadAttempts {
			_, err = tx.Exec(c.work, sqlDeleteAttempts, c.l.ib.Consumer(), m.Topic, m.TopicID, m.Partition, m.Offset)
			if err != nil {
				err = fmt.Errorf("delete from pgbox_consumer_attempts: %w", err)
			}
		}
		return err
	})
	return res, err, herr
}

// failed handles an attempt that failed through the message's (or its
// handler's) fault: it counts the attempt, then dead-letters m or waits before
// the next attempt. done is true when m was dead-lettered, ok false when the
// claim must stop.
func (c *claimRun[R]) failed(sm R, m inbox.Message, err error, kind errKind) (done, ok bool) {
	c.l.stats.failures.Add(1)
	attempts, ok := c.countAttempt(m, err)
	if !ok || attempts == 0 {
		return false, ok
	}
	if kind == errPermanent || attempts >= c.l.cfg.MaxAttempts {
		return true, c.deadLetter(sm, m, err, attempts)
	}
	c.l.stats.retries.Add(1)
	c.l.log.WarnContext(c.work, "pgbox: handler failed, retrying",
		"topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
		"attempt", attempts, "max_attempts", c.l.cfg.MaxAttempts, "error", err)
	return false, c.sleep(c.l.backoff(attempts))
}

// infraError handles a database (or other infrastructure) error that is not
// the message's fault: never counted as an attempt, never dead-lettered. A
// retryable one waits and returns true; one that needs an operator ends the
// claim with it (false).
func (c *claimRun[R]) infraError(kind errKind, m inbox.Message, n int, err error, what string) bool {
	if kind == errOperator {
		return c.fail(m, err, what)
	}
	c.l.stats.transient.Add(1)
	c.l.stats.retries.Add(1)
	level, msg := slog.LevelWarn, "pgbox: transient database error, retrying"
	if kind == errUnknown {
		level, msg = slog.LevelError, "pgbox: database error, retrying"
	}
	c.l.log.Log(c.work, level, msg,
		"topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "what", what, "retry", n, "error", err)
	return c.sleep(c.l.backoff(n))
}

// infraKind classifies the error of a step whose failure is never the
// message's fault (reading the claim's state, recording an attempt,
// dead-lettering): what classify would blame on the message is unknown here.
func infraKind(err error) errKind {
	if k := classify(err, nil); k != errHandler && k != errPermanent {
		return k
	}
	return errUnknown
}

// fail ends the claim with err, an error retrying cannot fix: Run returns
// it to the adapter.
func (c *claimRun[R]) fail(m inbox.Message, err error, what string) bool {
	c.l.stats.operator.Add(1)
	c.fatal = fmt.Errorf("%s: consumer %q, %s/%d: %s at offset %d: %w",
		c.l.cfg.Name, c.l.ib.Consumer(), m.Topic, m.Partition, what, m.Offset, pgerr.WithFix(err))
	c.l.log.ErrorContext(c.work, "pgbox: database needs an operator, ending the claim",
		"topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "what", what,
		"fix", pgerr.Fix(err), "error", err)
	return false
}

func (c *claimRun[R]) recordAttempt(m inbox.Message, cause error) (int, error) {
	var n int
	err := c.l.pool.QueryRow(c.work, sqlRecordAttempt, c.l.ib.Consumer(), m.Topic, m.TopicID, m.Partition, m.Offset,
		errorText(cause)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("record attempt of %s in pgbox_consumer_attempts: %w", m, err)
	}
	return n, nil
}

// deadLetter dead-letters m, retrying database errors until it commits;
// false when the claim must stop first.
func (c *claimRun[R]) deadLetter(sm R, m inbox.Message, cause error, attempts int) bool {
	return c.retry(m, "dead-lettering", func() (error, error) {
		var dup, written bool
		var dlq string
		err := c.inTx(func(tx pgx.Tx) error {
			var err error
			dup, written, dlq, err = c.writeDeadLetter(tx, m, cause, attempts)
			return err
		})
		if err != nil {
			return err, nil
		}
		delete(c.attempted, m.Offset)
		switch {
		case dup:
			c.l.stats.duplicates.Add(1)
		case written:
			c.l.stats.dead.Add(1)
			c.l.log.ErrorContext(c.work, "pgbox: message dead-lettered",
				"topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
				"attempts", attempts, "dead_letter_topic", dlq, "error", cause)
		}
		c.claim.Mark(sm)
		return nil, nil
	}, nil)
}

// retry is the one retry skeleton of a claim: it runs try (which applies its
// own success) until try returns nil, the claim stops, or an error ends the
// claim. Errors that are not the message's fault (the database, the network)
// go to infraError: retried with backoff, never counted, or the claim ends
// when one needs an operator. An error of the message or its handler (herr is
// the handler's own error) goes to fault, which says whether the step is done
// (and ok whether the claim goes on); a step without a fault (nil) treats
// such an error as unknown, retried like the database's. retry returns false
// when the claim must stop.
func (c *claimRun[R]) retry(m inbox.Message, what string, try func() (err, herr error), fault func(err, herr error, kind errKind) (done, ok bool)) bool {
	for n := 1; ; n++ {
		if c.stopped() {
			return false
		}
		err, herr := try()
		if err == nil {
			return true
		}
		if c.work.Err() != nil {
			return false
		}
		kind := classify(err, herr)
		if fault == nil {
			kind = infraKind(err)
		}
		if kind == errRetry || kind == errUnknown || kind == errOperator {
			if !c.infraError(kind, m, n, err, what) {
				return false
			}
			continue
		}
		if done, ok := fault(err, herr, kind); !ok || done {
			return ok
		}
	}
}

// maxConflictTries bounds inTx's runs of a transaction whose batch met a
// key seen before (owntx.Conflict).
const maxConflictTries = 3

// inTx runs fn in a transaction on the pool and commits it. BEGIN goes out
// with fn's first batch of statements (lazyTx). When fn fails, the
// transaction is rolled back whole: this is what lets Process and
// ProcessBatch run without their savepoint in it (owntx.With).
func (c *claimRun[R]) inTx(fn func(pgx.Tx) error) error {
	conn, err := c.l.pool.Acquire(c.work)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer conn.Release()
	tx := &lazyTx{conn: conn.Conn()} // begun by fn's first batch: the dedup step
	for try := 1; ; try++ {
		err := fn(tx)
		if err == nil {
			break
		}
		rollback(c.work, tx)
		// A batch's plain key insert met a key seen before (a
		// redelivery): nothing else ran, and the next try takes ON
		// CONFLICT (the inbox's probe window is open). Bounded all the
		// same: past it, an error like others.
		// Never after the claim stopped: no transaction starts then (the
		// batch stays unmarked and goes to the partition's next owner).
		if !owntx.IsConflict(err) || try == maxConflictTries || c.stopped() || c.work.Err() != nil {
			return err
		}
		tx = &lazyTx{conn: conn.Conn()}
	}
	// Once COMMIT is sent its outcome is the server's: the drain timeout
	// must not cut the client off it. Cut off, the client cannot tell a
	// COMMIT that still went through (a WAL flush is not cancellable), so
	// a transaction that committed would never be marked and a graceful
	// stop would leave the group's offsets short of what committed (issue
	// 34). The COMMIT gets commitTimeout of its own instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.work), commitTimeout)
	defer cancel()
	if err := tx.Commit(ctx); err != nil {
		if c.work.Err() != nil {
			c.l.log.WarnContext(ctx, "pgbox: COMMIT failed while the claim stopped: its outcome is unknown and its offsets are not marked (if it committed, the records are redelivered and deduplicated)",
				"topic", c.claim.Topic(), "partition", c.claim.Partition(), "error", err)
		}
		return &commitError{err: err}
	}
	return nil
}

func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// commitError marks an error of COMMIT itself.
type commitError struct{ err error }

func (e *commitError) Error() string { return "commit: " + e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// wrap adapts the user's handler: it records the handler's own error in
// *herr (to tell it from the inbox's) and turns a panic into an error.
func (c *claimRun[R]) wrap(herr *error) inbox.HandlerFunc {
	fn := c.l.fn
	return func(ctx context.Context, tx pgx.Tx, m inbox.Message) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("handler panicked: %v", r)
			}
			if err != nil {
				*herr = err
			}
		}()
		return fn(ctx, tx, m)
	}
}

func (c *claimRun[R]) message(sm R) inbox.Message {
	m := c.claim.Message(sm)
	m.TopicID = c.topicID
	return m
}

// count counts a committed message, and logs the gap before it (watermark
// modes): offsets this consumer never processed are never skipped silently.
func (c *claimRun[R]) count(m inbox.Message, r inbox.Result) {
	if r.Duplicate {
		c.l.stats.duplicates.Add(1)
	} else {
		c.l.stats.processed.Add(1)
	}
	if r.Gap > 0 {
		c.l.stats.gaps.Add(1)
		c.l.log.WarnContext(c.work, "pgbox: offsets skipped since the partition's watermark "+
			"(the group's offset moved forward past records, or retention, compaction or transaction markers left a hole)",
			"topic", m.Topic, "partition", m.Partition, "offset", m.Offset,
			"gap", r.Gap, "first_skipped_offset", m.Offset-r.Gap)
	}
}

// errorText is an error's message fit for a text column and a header.
func errorText(err error) string {
	s := err.Error()
	const maxLen = 4096
	if len(s) > maxLen {
		s = s[:maxLen]
	}
	b := []byte(s)
	out := b[:0]
	for _, ch := range b {
		if ch != 0 {
			out = append(out, ch)
		}
	}
	return strings.ToValidUTF8(string(out), "\uFFFD")
}

// cleanupTimeout bounds the rollback after a failure; it runs even when the
// work context is already cancelled.
const cleanupTimeout = 10 * time.Second

// commitTimeout bounds a COMMIT, which the drain timeout does not (see
// inTx): a stop waits at most this long past DrainTimeout for the COMMIT
// in flight.
const commitTimeout = 10 * time.Second
