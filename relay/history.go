package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/slot"
)

// The heartbeat's backlog count and history sample (issue 32). Counting
// the backlog from each slot's first index entry, or reading the heap,
// costs as much as the outbox has dead rows: a held snapshot (pg_dump, a
// long report, a replica's hot_standby_feedback) keeps every published and
// deleted row for as long as it lasts, and a count over ~1.7M of them was
// cancelled by the heartbeat's timeout at every sample, leaving the
// console's chart empty for the whole hold. So the relay remembers, per
// slot, where the slot's unpublished rows began at the previous sample, and
// the next count starts there, along pgbox_outbox_claim_idx: it reads the
// rows published since (one sample interval's worth) and the backlog, not
// the hold's history.
//
// Where a slot's rows begin is found once, after the relay starts (or the
// sequence went back), by reading the claim index in windows of ids for
// all slots not found yet, oldest first, for at most a quarter of the
// count's time per sample: each window reads at most as many index entries as it spans
// ids, dead or alive, so no read is unbounded. Until every slot is found,
// a sample counts the slots found so far (a lower bound).
//
// What a count can miss: a row that commits more than one sample interval
// after taking its id, below where its slot's count starts (a long writing
// transaction); a parked row an operator retries (its id is old). Both are
// counted again by the next relay that starts, and the relay publishes them
// whatever the chart says.

// historyState is what the backlog count remembers between samples; only
// its goroutine (countLoop) touches it.
type historyState struct {
	found [slot.Count]bool
	from  [slot.Count]int64 // a found slot's count starts here
	scan  int64             // the next discovery window starts here
	width int64             // the discovery window's width in ids
	top   int64             // the highest id known taken at the previous sample
}

const (
	// historyWindowMin and historyWindowMax bound the discovery window,
	// which doubles while a window reads in less than historyWindowFor and
	// halves when it takes longer than twice that.
	historyWindowMin = 10_000
	historyWindowMax = 200_000
	historyWindowFor = 50 * time.Millisecond
	// historyDiscoverMax bounds discovery per sample when the count has
	// no deadline.
	historyDiscoverMax = time.Second
)

// historySetSQL makes the count and discovery read the claim index: after
// ANALYZE of a bloated heap the planner prefers a bitmap scan, which reads
// every entry of a slot's range instead of stopping at the cap. JIT off, as
// in the claim: compiling the count's expressions cost more than running
// them (~13 ms of a 100,000-row count).
const historySetSQL = `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off`

// historyTopSQL reads the outbox sequence's last value: NULL when the relay
// may not read it (then the highest id a count saw stands in), 0 when the
// sequence handed out no id yet (no row was ever written: every slot is
// empty, found at once instead of searched for; unless rows were seen,
// see recordHistory).
const historyTopSQL = `SELECT CASE WHEN has_sequence_privilege(q, 'SELECT, USAGE') THEN coalesce(pg_sequence_last_value(q), 0) END
FROM pg_get_serial_sequence('pgbox_outbox', 'id') AS s(name), LATERAL (SELECT s.name::regclass) AS r(q)`

// historyDiscoverSQL finds the first unparked row of each slot in the id
// window [$1, $2), along the primary key: it reads at most as many index
// entries as the window spans ids, dead or alive, in heap order.
const historyDiscoverSQL = `SELECT slot::int, min(id) FROM pgbox_outbox
WHERE id >= $1 AND id < $2 AND parked_at IS NULL
GROUP BY slot`

// historySQL writes one sample of the outbox to pgbox_relay_history
// (migration 00110), which the console's overview charts over the last
// hour: per topic, the unpublished, unparked backlog of the slots $4, each
// counted from its id in $5 (so that no sample reads the rows published
// before the previous one: see above), up to $1 rows in all (a capped count
// is a lower bound), and the rows this instance published of it since its
// previous sample ($2 topics, $3 counts). A row with topic ” marks the
// sample itself, so an idle outbox still shows as zero rather than as no
// data. Samples older than two hours are deleted in the same statement, so
// the table stays a few thousand rows. It returns, per slot with rows, its
// first row's id, its last row's and how many it counted.
const historySQL = `WITH r AS MATERIALIZED (
	SELECT s.s, o.id, o.topic
	FROM unnest($4::int[], $5::bigint[]) AS s(s, f)
	CROSS JOIN LATERAL (
		SELECT id, topic FROM pgbox_outbox
		WHERE slot = s.s AND parked_at IS NULL AND id >= s.f
		ORDER BY id LIMIT $1
	) o
	LIMIT $1
), b AS (
	SELECT topic, count(*)::bigint AS n FROM r GROUP BY topic
), p AS (
	SELECT topic, n FROM unnest($2::text[], $3::bigint[]) AS p(topic, n)
), ins AS (
	INSERT INTO pgbox_relay_history (topic, backlog, published)
	SELECT '', 0, 0
	UNION ALL
	SELECT coalesce(b.topic, p.topic), coalesce(b.n, 0), coalesce(p.n, 0) FROM b FULL JOIN p ON b.topic = p.topic
), old AS (
	DELETE FROM pgbox_relay_history WHERE at < now() - interval '2 hours'
)
SELECT s, min(id), max(id), count(*) FROM r GROUP BY s`

// recordHistory writes one history sample (historySQL): published holds the
// rows this instance published per topic since its previous call. It
// returns the whole backlog, counted up to backlogCap (a lower bound until
// every slot's start is found, see above). countLoop runs it (countBacklog)
// at the heartbeat's request, every backlogEvery-th beat, 10 s by default.
func (r *Relay) recordHistory(ctx context.Context, published map[string]uint64) (backlog int64, err error) {
	topics := make([]string, 0, len(published))
	counts := make([]int64, 0, len(published))
	for t, n := range published {
		topics, counts = append(topics, t), append(counts, int64(n))
	}
	h := &r.hist
	err = r.db.begin(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, historySetSQL); err != nil {
			return err
		}
		var top *int64
		if err := tx.QueryRow(ctx, historyTopSQL).Scan(&top); err != nil {
			return fmt.Errorf("read the outbox sequence: %w", err)
		}
		if top != nil && *top == 0 && h.top > 0 {
			// No id handed out since a RESTART, or rows inserted with ids
			// of their own before any: rows are there all the same, so 0
			// says nothing; the highest id seen stands in, as when the
			// sequence may not be read.
			top = nil
		}
		if top != nil && *top < h.top {
			*h = historyState{} // the sequence went back: find every slot again
		}
		if err := h.discover(ctx, tx, top); err != nil {
			return err
		}
		var slots []int32
		var froms []int64
		for s := range slot.Count {
			if h.found[s] {
				slots, froms = append(slots, int32(s)), append(froms, h.from[s])
			}
		}
		rows, err := tx.Query(ctx, historySQL, backlogCap, topics, counts, slots, froms)
		if err != nil {
			return err
		}
		firsts := map[int32]int64{}
		seen := h.top
		var s int32
		var first, last, n int64
		_, err = pgx.ForEachRow(rows, []any{&s, &first, &last, &n}, func() error {
			firsts[s] = first
			seen = max(seen, last)
			backlog += n
			return nil
		})
		if err != nil {
			return err
		}
		capped := backlog >= backlogCap
		// A slot's next count starts at its first unpublished row, but no
		// later than the ids taken by the previous sample: a row that took
		// its id since and commits later is counted. Slots a capped count
		// did not reach keep their start.
		for _, s := range slots {
			f, ok := firsts[s]
			if !ok && capped {
				continue
			}
			if !ok || f > h.top+1 {
				f = h.top + 1
			}
			h.from[s] = max(h.from[s], f)
		}
		if top != nil {
			seen = max(seen, *top)
		}
		h.top = seen
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("relay: record a history sample: %w", err)
	}
	return backlog, nil
}

// discover reads discovery windows for the slots not found yet, oldest ids
// first, for at most a quarter of the time ctx has left (the count needs
// the rest). top is the outbox
// sequence's last value (nil when the relay may not read it: the highest id
// seen so far stands in, once there is one): once the windows pass it,
// every slot still missing is empty, and its count starts past it.
func (h *historyState) discover(ctx context.Context, tx pgx.Tx, top *int64) error {
	budget := historyDiscoverMax
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d)/4)
	}
	t0 := time.Now()
	h.width = max(h.width, historyWindowMin)
	var last time.Duration // the last window's read
	for {
		var missing []int32
		for s := range slot.Count {
			if !h.found[s] {
				missing = append(missing, int32(s))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		bound := h.top
		if top != nil {
			bound = max(bound, *top)
		}
		if h.scan > bound && (top != nil || bound > 0) {
			for _, s := range missing {
				h.found[s], h.from[s] = true, bound+1
			}
			return nil
		}
		if time.Since(t0)+2*last >= budget {
			return nil // the next window might not fit
		}
		end := h.scan + h.width
		w0 := time.Now()
		rows, err := tx.Query(ctx, historyDiscoverSQL, h.scan, end)
		if err != nil {
			return fmt.Errorf("find where the slots' rows begin: %w", err)
		}
		var s int32
		var first int64
		_, err = pgx.ForEachRow(rows, []any{&s, &first}, func() error {
			if !h.found[s] {
				h.found[s], h.from[s] = true, first
			}
			h.top = max(h.top, first)
			return nil
		})
		if err != nil {
			return fmt.Errorf("find where the slots' rows begin: %w", err)
		}
		h.scan = end
		switch last = time.Since(w0); {
		case last < historyWindowFor:
			h.width = min(h.width*2, historyWindowMax)
		case last > 2*historyWindowFor:
			h.width = max(h.width/2, historyWindowMin)
		}
	}
}

// countPublished adds a recorded batch's published rows to the per-topic
// counts the next history sample takes.
func (r *Relay) countPublished(byTopic map[string]uint64) {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	if r.pubByTopic == nil {
		r.pubByTopic = map[string]uint64{}
	}
	for t, n := range byTopic {
		r.pubByTopic[t] += n
	}
}

// takePublished returns and resets the per-topic counts.
func (r *Relay) takePublished() map[string]uint64 {
	r.pubMu.Lock()
	defer r.pubMu.Unlock()
	m := r.pubByTopic
	r.pubByTopic = nil
	return m
}
