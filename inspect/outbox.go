package inspect

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/slot"
)

// readBacklog counts unparked rows exactly up to the limit, by topic and
// lane; past it, per topic from statistics (sqlBacklogLive).
func (s *Snapshot) readBacklog(ctx context.Context, tx pgx.Tx, cfg Config) error {
	var n int64
	if err := tx.QueryRow(ctx, sqlUnpublishedBounded, cfg.ExactLimit).Scan(&n); err != nil {
		return fmt.Errorf("inspect: count pgbox_outbox: %w", err)
	}
	if n < int64(cfg.ExactLimit) {
		rows, err := tx.Query(ctx, sqlBacklogExact)
		if err != nil {
			return fmt.Errorf("inspect: read pgbox_outbox backlog: %w", err)
		}
		bySlot, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicBacklog, error) {
			var b TopicBacklog
			err := r.Scan(&b.Topic, &b.Lane, &b.Unpublished) // Lane holds the slot here
			return b, err
		})
		if err != nil {
			return fmt.Errorf("inspect: read pgbox_outbox backlog: %w", err)
		}
		s.Topics = byLane(bySlot, s.LaneCount)
		s.Outbox.Unpublished = n
		return nil
	}
	var live int64
	if err := tx.QueryRow(ctx, sqlBacklogLive, cfg.ExactLimit).Scan(&live); err != nil {
		return fmt.Errorf("inspect: estimate pgbox_outbox backlog: %w", err)
	}
	rows, err := tx.Query(ctx, sqlBacklogEstimate, live)
	if err != nil {
		return fmt.Errorf("inspect: estimate pgbox_outbox backlog: %w", err)
	}
	s.Topics, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicBacklog, error) {
		b := TopicBacklog{Lane: -1, Estimated: true}
		err := r.Scan(&b.Topic, &b.Unpublished)
		return b, err
	})
	if err != nil {
		return fmt.Errorf("inspect: estimate pgbox_outbox backlog: %w", err)
	}
	var sum int64
	for _, b := range s.Topics {
		sum += b.Unpublished
	}
	// At least what was counted: statistics can lag a fast-growing backlog.
	// The live rows, when the topics' shares miss some (rare topics, an
	// outbox never analyzed).
	s.Outbox.Unpublished, s.Outbox.Estimated = max(sum, live, n), true
	return nil
}

// byLane sums per-slot backlogs (Lane holding the slot) into lanes, with the
// relay's own mapping, ordered by topic and lane.
func byLane(bySlot []TopicBacklog, lanes int) []TopicBacklog {
	type key struct {
		topic string
		lane  int
	}
	sums := map[key]int64{}
	for _, b := range bySlot {
		sums[key{b.Topic, slot.Lane(b.Lane, lanes)}] += b.Unpublished
	}
	out := make([]TopicBacklog, 0, len(sums))
	for k, n := range sums {
		out = append(out, TopicBacklog{Topic: k.topic, Lane: k.lane, Unpublished: n})
	}
	slices.SortFunc(out, func(a, b TopicBacklog) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Lane, b.Lane))
	})
	return out
}

// readLaneAges finds each lane's oldest unpublished row, one index probe per
// slot.
func (s *Snapshot) readLaneAges(ctx context.Context, tx pgx.Tx, _ Config) error {
	oldest := make([]*time.Time, s.LaneCount)
	rows, err := tx.Query(ctx, sqlOldestPerSlot, slot.Count)
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_outbox oldest rows: %w", err)
	}
	for rows.Next() {
		var n int
		var at *time.Time
		if err := rows.Scan(&n, &at); err != nil {
			rows.Close()
			return fmt.Errorf("inspect: read pgbox_outbox oldest rows: %w", err)
		}
		if lane := slot.Lane(n, s.LaneCount); at != nil && (oldest[lane] == nil || at.Before(*oldest[lane])) {
			oldest[lane] = at
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inspect: read pgbox_outbox oldest rows: %w", err)
	}
	var overall time.Duration = -1
	s.LaneAges = make([]LaneAge, s.LaneCount)
	for lane, at := range oldest {
		s.LaneAges[lane].Lane = lane
		if at != nil {
			age := max(s.Time.Sub(*at), 0)
			s.LaneAges[lane].OldestAge = seconds(age)
			overall = max(overall, age)
		}
	}
	if overall >= 0 {
		s.Outbox.OldestAge = seconds(overall)
	}
	return nil
}

// readParked counts parked rows per topic (bounded) and lists the newest,
// each with the rows it holds back (a bounded count: heldBy).
func (s *Snapshot) readParked(ctx context.Context, tx pgx.Tx, cfg Config) error {
	rows, err := tx.Query(ctx, sqlParkedBounded, cfg.ExactLimit)
	if err != nil {
		return fmt.Errorf("inspect: count parked rows: %w", err)
	}
	s.ParkedTopics, err = pgx.CollectRows(rows, pgx.RowToStructByPos[TopicCount])
	if err != nil {
		return fmt.Errorf("inspect: count parked rows: %w", err)
	}
	for _, p := range s.ParkedTopics {
		s.Outbox.Parked += p.Count
	}
	s.Outbox.ParkedCapped = s.Outbox.Parked >= int64(cfg.ExactLimit)
	rows, err = tx.Query(ctx, sqlParkedNewest, cfg.ParkedList, heldScan(cfg.HeldScan))
	if err != nil {
		return fmt.Errorf("inspect: list parked rows: %w", err)
	}
	s.Parked, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		err := r.Scan(&p.ID, &p.EventID, &p.Topic, &p.Attempts, &p.LastError, &p.ParkedAt, &p.Held, &p.HeldCapped)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("inspect: list parked rows: %w", err)
	}
	return nil
}
