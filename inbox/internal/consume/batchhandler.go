package consume

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/internal/owntx"
)

// handlerOf checks that exactly one of the per-message handler fn and
// cfg.BatchHandler is set.
func handlerOf(fn inbox.HandlerFunc, cfg Config, ctor string) error {
	switch {
	case fn == nil && cfg.BatchHandler == nil:
		return fmt.Errorf("%s: %s: nil HandlerFunc (pass the func that does each message's business work, or set Config.BatchHandler to handle a batch at once)", cfg.Name, ctor)
	case fn != nil && cfg.BatchHandler != nil:
		return fmt.Errorf("%s: %s: both a HandlerFunc and Config.BatchHandler are set (pass a nil HandlerFunc when the BatchHandler does the work)", cfg.Name, ctor)
	}
	return nil
}

// processBatch runs a batch in tx: ProcessBatchAtOnce with the batch
// handler when there is one, else ProcessBatch with the per-message handler.
// *herr is the handler's own error; for a batch handler's *inbox.BatchError,
// the error of the first message it names (the one the returned
// *inbox.MessageError names), so that it is classified as that message's.
func (c *claimRun[R]) processBatch(tx pgx.Tx, msgs []inbox.Message, herr *error) ([]inbox.Result, error) {
	ctx := owntx.With(c.work, tx)
	if c.l.cfg.BatchHandler == nil {
		return c.l.ib.ProcessBatch(ctx, tx, msgs, c.wrap(herr))
	}
	res, err := c.l.ib.ProcessBatchAtOnce(ctx, tx, msgs, c.wrapBatch(herr))
	var me *inbox.MessageError
	if err != nil && *herr != nil && errors.As(err, &me) {
		*herr = me.Err
	}
	return res, err
}

// processOneIn runs one message in tx, through the batch handler (as a
// batch of one) when there is one.
func (c *claimRun[R]) processOneIn(tx pgx.Tx, m inbox.Message, herr *error) (inbox.Result, error) {
	if c.l.cfg.BatchHandler == nil {
		return c.l.ib.Process(owntx.With(c.work, tx), tx, m, c.wrap(herr))
	}
	res, err := c.processBatch(tx, []inbox.Message{m}, herr)
	if err != nil {
		return inbox.Result{}, err
	}
	return res[0], nil
}

// wrapBatch is wrap for the batch handler.
func (c *claimRun[R]) wrapBatch(herr *error) inbox.BatchHandlerFunc {
	fn := c.l.cfg.BatchHandler
	return func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("batch handler panicked: %v", r)
			}
			if err != nil {
				*herr = err
			}
		}()
		return fn(ctx, tx, ms)
	}
}

// cutAt reports the message a batch handler failed, by its position in the
// batch: the batch is then cut there (see cut). A batch handler's error that
// names no message, and the per-message handler's errors, leave the batch to
// fallBack.
func (c *claimRun[R]) cutAt(n int, err, herr error) (int, bool) {
	var me *inbox.MessageError
	if c.l.cfg.BatchHandler == nil || herr == nil || !errors.As(err, &me) || me.Index < 0 || me.Index >= n {
		return 0, false
	}
	return me.Index, true
}

// cut carries on after the batch handler failed message k of batch, keeping
// the partition's order: the failed run counts as k's attempt, the messages
// before k are processed again as a batch (they commit first), then k alone
// (retried or dead-lettered as any failed message), then the messages after
// k as a new batch. False when the claim must stop.
func (c *claimRun[R]) cut(batch []R, msgs []inbox.Message, k int, err error, kind errKind) bool {
	c.l.stats.fallbacks.Add(1)
	m := msgs[k]
	c.l.log.WarnContext(c.work, "pgbox: the batch handler failed a message: the batch is cut there, the messages before it go first",
		"topic", m.Topic, "partition", m.Partition, "first_offset", msgs[0].Offset, "failed_offset", m.Offset,
		"size", len(msgs), "error", err)
	if !c.batchAttempt(m, err, kind) {
		return false
	}
	if k > 0 && !c.handle(batch[:k]) {
		return false
	}
	if !c.handleOne(batch[k], m) {
		return false
	}
	return k+1 == len(batch) || c.handle(batch[k+1:])
}

// batchAttempt counts a failed run of m inside a batch as m's attempt (so
// MaxAttempts holds in batch mode too); when it was m's last allowed one (or
// the error is permanent), m is dead-lettered when its turn comes, not run
// again. False when the claim must stop.
func (c *claimRun[R]) batchAttempt(m inbox.Message, err error, kind errKind) bool {
	c.l.stats.failures.Add(1)
	attempts, ok := c.countAttempt(m, err)
	if !ok {
		return false
	}
	if attempts > 0 && (kind == errPermanent || attempts >= c.l.cfg.MaxAttempts) {
		c.exhausted[m.Offset] = exhausted{cause: err, attempts: attempts}
	}
	return true
}
