package relay

import (
	"context"
	"fmt"

	"github.com/pgbox/pgbox/outbox"
)

// PublishHook, set as Config.PublishHook, is told about every batch the
// relay publishes: one call per pass that sends rows, before they are sent,
// and the end func it returns once Kafka has answered. It is the relay's
// tracing seam: pgboxotel.Tracer implements it (one producer span per
// batch, linked to each writer's trace), and the relay itself imports no
// tracing library. It is called from the relay's worker goroutine, one
// batch at a time; it must not block (it delays the publish) nor keep the
// records' slices after returning.
type PublishHook interface {
	StartPublish(ctx context.Context, records []PublishRecord) (end func(published int, err error))
}

// PublishRecord is one row of a batch as PublishHook sees it: the record the
// relay is about to send, before pgbox's own headers are added.
type PublishRecord struct {
	Topic   string
	Key     []byte // nil: no key
	EventID string // the value of the EventIDHeader the record will carry
	Headers []outbox.Header
}

// startPublish calls the hook, if any, for rows.
func (r *Relay) startPublish(ctx context.Context, rows []row) func(published int, err error) {
	if r.cfg.PublishHook == nil {
		return func(int, error) {}
	}
	recs := make([]PublishRecord, len(rows))
	for i := range rows {
		x := &rows[i]
		recs[i] = PublishRecord{Topic: x.topic, Key: x.key, EventID: x.eventID.String(), Headers: x.headers}
	}
	return r.cfg.PublishHook.StartPublish(ctx, recs)
}

// publishErr is the error a batch's end reports: the transient failure, or
// the first permanent one; nil when every record was published.
func (t *tally) publishErr(rows int) error {
	switch {
	case t.res.err != nil:
		return t.res.err
	case len(t.badErrs) > 0:
		return fmt.Errorf("%d of %d records failed permanently, first: %s", len(t.badErrs), rows, t.badErrs[0])
	}
	return nil
}
