package relay

import (
	"context"
	"fmt"

	"github.com/pgbox/pgbox/outbox"
)

// startPublish calls the hook, if any, for rows.
func (r *Relay) startPublish(ctx context.Context, rows []row) func(published int, err error) {
	if r.cfg.PublishHook == nil {
		return func(int, error) {}
	}
	recs := make([]outbox.PublishRecord, len(rows))
	for i := range rows {
		x := &rows[i]
		recs[i] = outbox.PublishRecord{Topic: x.topic, Key: x.key, EventID: x.eventID.String(), Headers: x.headers}
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
