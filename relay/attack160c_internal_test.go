package relay

// Third review of 00160 (f621cc3): the finish's count of failed rows
// parked from outside (held), beside the rows it parks itself.

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// One batch: a row published, a row parked by this finish (its fifth
// attempt), a row parked from outside while it was out, a row left for a
// later pass, and a published row parked from outside. Each is counted
// once: Published 2, Parked 1, Retried 1 (not the outside park), and the
// outside park keeps its last_error while the relay's own failure writes
// its own. Then a batch with no failed row at all (empty arrays). PASSES.
func TestAttack160cFinishCountsEachFailedRowOnce(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value, attempts) VALUES
		('t', 'a', 'ok', 0), ('t', 'b', 'last', 4), ('t', 'c', 'outside', 0), ('t', 'd', 'again', 0), ('t', 'e', 'okparked', 0)`)
	rows := g.claim()
	require.Len(t, rows, 5)
	idx := map[string]int{}
	for i, r := range rows {
		idx[string(r.value)] = i
	}
	g.exec(`UPDATE pgbox_outbox SET parked_at = now() - interval '1 minute', last_error = 'operator' WHERE value IN ('outside', 'okparked')`)
	g.finish(rows, map[int]error{
		idx["ok"]: nil, idx["okparked"]: nil,
		idx["last"]: sarama.ErrMessageSizeTooLarge, idx["outside"]: sarama.ErrMessageSizeTooLarge, idx["again"]: sarama.ErrMessageSizeTooLarge,
	})
	st := g.r.Stats()
	require.EqualValues(t, 2, st.Published)
	require.EqualValues(t, 1, st.Parked)
	require.EqualValues(t, 1, st.Retried)
	errs := map[string]string{}
	rs, err := g.db.Pool.Query(context.Background(), `SELECT convert_from(value, 'UTF8'), coalesce(last_error, '') FROM pgbox_outbox`)
	require.NoError(t, err)
	for rs.Next() {
		var v, e string
		require.NoError(t, rs.Scan(&v, &e))
		errs[v] = e
	}
	require.NoError(t, rs.Err())
	require.Len(t, errs, 3, "the published rows are gone, the parked-from-outside one too")
	require.Equal(t, "operator", errs["outside"])
	require.NotEqual(t, "operator", errs["last"])
	require.NotEmpty(t, errs["again"])

	g.exec(`INSERT INTO pgbox_outbox (topic, key, value) VALUES ('t', 'f', 'alone')`)
	rows = g.claim()
	require.Len(t, rows, 2, "the new row and the one left for a later pass")
	g.finish(rows, map[int]error{0: nil, 1: nil})
	st = g.r.Stats()
	require.EqualValues(t, 4, st.Published)
	require.EqualValues(t, 1, st.Retried)
}

// The relay's own finish and f621cc3's rewind function: a keyless row
// whose event_id is NULL (the column's NOT NULL dropped; finishSQL matches
// such a row through coalesce) is parked from outside while its send
// succeeds. The finish deletes it (the record is in Kafka), 00120's
// delete trigger runs pgbox_outbox_rewind(), which now calls
// pgbox_outbox_slot(NULL, NULL): "upper bound of FOR loop cannot be
// null". The whole batch's outcome is lost and it is sent again at every
// pass. FAILS on f621cc3 (migrations' TestAttack160cRewindOfKeylessRowWithoutEventID
// is the same defect in SQL).
func TestAttack160cFinishOfKeylessRowWithoutEventID(t *testing.T) {
	t.Parallel()
	g := newFinishRig(t, 5, 0)
	g.exec(`ALTER TABLE pgbox_outbox ALTER COLUMN event_id DROP NOT NULL`)
	g.exec(`INSERT INTO pgbox_outbox (topic, key, value, event_id, slot) VALUES ('t', NULL, 'v', NULL, 7)`)
	rows := g.claim()
	require.Len(t, rows, 1)
	g.exec(`UPDATE pgbox_outbox SET parked_at = now() WHERE id = $1`, rows[0].id)
	tl := g.r.tally(rows, map[int]error{0: nil})
	b := finishedBatch{tally: tl, rows: len(rows), start: time.Now(), claimed: time.Now(), sent: time.Now()}
	_, err := g.r.finish(context.Background(), &b)
	require.NoError(t, err, "recording a published row that was parked from outside")
	require.Empty(t, g.rows())
}
