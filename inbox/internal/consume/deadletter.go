package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// writeDeadLetter is the dead-letter transaction's work: record m's key in
// the inbox (so a redelivery is a duplicate), record it in
// pgbox_consumer_dead, and write the dead-letter record to the outbox. dup is
// true when the key turned out to be processed meanwhile (nothing written);
// written is false when this record was dead-lettered before.
func (c *claimRun[R]) writeDeadLetter(tx pgx.Tx, m inbox.Message, cause error, attempts int) (dup, written bool, dlq string, err error) {
	ctx := c.work
	dlq = c.l.deadLetterTopic(m.Topic)
	consumer := c.l.ib.Consumer()

	// A savepoint of our own: whatever Process does on failure, the
	// transaction stays usable for the dead-letter row.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, false, dlq, fmt.Errorf("savepoint: %w", err)
	}
	var key *string
	res, perr := c.l.ib.Process(ctx, sp, m, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
	switch {
	case perr == nil:
		if err := sp.Commit(ctx); err != nil {
			return false, false, dlq, fmt.Errorf("release savepoint: %w", err)
		}
		if res.Duplicate {
			// Another delivery of the key committed meanwhile: its effects
			// exist, there is nothing to dead-letter.
			if _, err := tx.Exec(ctx, sqlDeleteAttempts, consumer, m.Topic, m.TopicID, m.Partition, m.Offset); err != nil {
				return false, false, dlq, fmt.Errorf("delete from pgbox_consumer_attempts: %w", err)
			}
			return true, false, dlq, nil
		}
		key = &res.Key
	case errors.Is(perr, inbox.ErrInvalidMessage), errors.Is(perr, inbox.ErrFingerprintMismatch):
		// No key to record (or it belongs to a different payload): the
		// pgbox_consumer_dead row alone makes this idempotent.
		if err := sp.Rollback(ctx); err != nil {
			return false, false, dlq, fmt.Errorf("roll back savepoint: %w", err)
		}
	default:
		return false, false, dlq, perr
	}

	var headers *string
	if len(m.Headers) > 0 {
		b, err := json.Marshal(m.Headers) // outbox.Header's storage format
		if err != nil {
			return false, false, dlq, fmt.Errorf("encode headers of %s: %w", m, err)
		}
		s := string(b)
		headers = &s
	}
	tag, err := tx.Exec(ctx, sqlInsertDead, consumer, m.Topic, m.TopicID, m.Partition, m.Offset, key, attempts, errorText(cause), dlq,
		m.Key, m.Value, headers)
	if err != nil {
		return false, false, dlq, fmt.Errorf("insert into pgbox_consumer_dead: %w", err)
	}
	if tag.RowsAffected() == 1 {
		rec := deadLetterRecord(m, consumer, key, cause, attempts, dlq)
		err := outbox.Write(ctx, tx, rec)
		if errors.Is(err, outbox.ErrInvalidMessage) {
			// Too large with the diagnostics added (or otherwise refused):
			// send the diagnostics without the payload rather than stall.
			// The payload stays in Kafka at the source offset.
			rec.Value = nil
			rec.Headers = append(dlqHeaders(m, consumer, key, cause, attempts),
				outbox.Header{Key: inbox.HeaderDLQContentDropped, Value: []byte(errorText(err))})
			err = outbox.Write(ctx, tx, rec)
		}
		if err != nil {
			return false, false, dlq, fmt.Errorf("write dead letter to outbox topic %s: %w", dlq, err)
		}
		written = true
	}
	if _, err := tx.Exec(ctx, sqlDeleteAttempts, consumer, m.Topic, m.TopicID, m.Partition, m.Offset); err != nil {
		return false, false, dlq, fmt.Errorf("delete from pgbox_consumer_attempts: %w", err)
	}
	return false, written, dlq, nil
}

func deadLetterRecord(m inbox.Message, consumer string, key *string, cause error, attempts int, dlq string) outbox.Message {
	hs := make([]outbox.Header, 0, len(m.Headers)+9)
	hs = append(hs, outbox.WithoutReserved(m.Headers)...) // the dead letter gets its own event id
	hs = append(hs, dlqHeaders(m, consumer, key, cause, attempts)...)
	return outbox.Message{Topic: dlq, Key: m.Key, Value: m.Value, Headers: hs}
}

func dlqHeaders(m inbox.Message, consumer string, key *string, cause error, attempts int) []outbox.Header {
	hs := []outbox.Header{
		{Key: inbox.HeaderDLQError, Value: []byte(errorText(cause))},
		{Key: inbox.HeaderDLQAttempts, Value: []byte(strconv.Itoa(attempts))},
		{Key: inbox.HeaderDLQSourceTopic, Value: []byte(m.Topic)},
		{Key: inbox.HeaderDLQSourcePart, Value: []byte(strconv.FormatInt(int64(m.Partition), 10))},
		{Key: inbox.HeaderDLQSourceOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
		{Key: inbox.HeaderDLQConsumer, Value: []byte(consumer)},
	}
	if m.TopicID != "" {
		hs = append(hs, outbox.Header{Key: inbox.HeaderDLQSourceTopicID, Value: []byte(m.TopicID)})
	}
	if key != nil {
		hs = append(hs, outbox.Header{Key: inbox.HeaderDLQKey, Value: []byte(*key)})
	}
	return hs
}
