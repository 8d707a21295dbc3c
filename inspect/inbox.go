package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/pgerr"
)

// readInbox lists each (consumer, topic) pair with its oldest key (a loose
// index scan) and its keys counted up to the limit; pairs at the limit get
// the planner's estimate instead, all in one round trip.
func (s *Snapshot) readInbox(ctx context.Context, tx pgx.Tx, cfg Config) error {
	rows, err := tx.Query(ctx, sqlInboxOldest, cfg.ExactLimit)
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_inbox oldest keys: %w", err)
	}
	s.Inbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxTopic, error) {
		var i InboxTopic
		err := r.Scan(&i.Consumer, &i.Topic, &i.Oldest, &i.Keys)
		return i, err
	})
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_inbox oldest keys: %w", err)
	}
	batch := &pgx.Batch{}
	for k := range s.Inbox {
		in := &s.Inbox[k]
		in.OldestAge = max(s.Time.Sub(in.Oldest), 0).Seconds()
		if in.Keys < int64(cfg.ExactLimit) {
			continue
		}
		batch.Queue(sqlInboxKeysEstimate, in.Consumer, in.Topic).QueryRow(func(row pgx.Row) error {
			est, err := planRows(row)
			if err != nil {
				return fmt.Errorf("inspect: estimate pgbox_inbox keys of consumer %q, topic %q: %w", in.Consumer, in.Topic, err)
			}
			in.Keys, in.Estimated = max(est, in.Keys), true
			return nil
		})
	}
	if batch.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, batch).Close()
}

// planRows returns the planner's row estimate of an EXPLAIN (FORMAT JSON).
func planRows(row pgx.Row) (int64, error) {
	var raw []byte
	if err := row.Scan(&raw); err != nil {
		return 0, err
	}
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) == 0 {
		return 0, fmt.Errorf("unreadable EXPLAIN output %.100q", raw)
	}
	return int64(plan[0].Plan.Rows), nil
}

// readDead counts dead letters per consumer and topic: every pair, each
// count exact up to the limit and capped past it. The table belongs to the
// consumer adapter's migration; its absence means none.
func (s *Snapshot) readDead(ctx context.Context, tx pgx.Tx, cfg Config) error {
	rows, err := tx.Query(ctx, sqlDeadCounts, cfg.ExactLimit)
	if err != nil {
		return fmt.Errorf("inspect: count pgbox_consumer_dead: %w", err)
	}
	s.Dead, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadCount, error) {
		var d DeadCount
		err := r.Scan(&d.Consumer, &d.Topic, &d.Count)
		if d.Count > int64(cfg.ExactLimit) {
			d.Count, d.Capped = int64(cfg.ExactLimit), true
		}
		return d, err
	})
	if pgerr.IsUndefinedTable(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect: count pgbox_consumer_dead: %w", err)
	}
	s.DeadEstimated = slices.ContainsFunc(s.Dead, func(d DeadCount) bool { return d.Capped })
	return nil
}

// addCutoffs reads each inbox topic's window from Kafka (cleanup.Cutoffs,
// no cleanup lease) and compares it with the topic's oldest keys.
func (s *Snapshot) addCutoffs(ctx context.Context, cfg cleanup.CutoffsConfig, log *slog.Logger) {
	if len(s.Inbox) == 0 {
		s.Cutoffs = "none needed: no keys"
		return
	}
	var topics []string
	seen := map[string]bool{}
	for _, in := range s.Inbox {
		if !seen[in.Topic] {
			seen[in.Topic] = true
			topics = append(topics, in.Topic)
		}
	}
	reps, err := cleanup.Cutoffs(ctx, cfg, topics, s.Time)
	if err != nil {
		log.WarnContext(ctx, "inspect: cannot read cleanup cutoffs", "err", err)
		s.Cutoffs = "unknown: " + err.Error()
		return
	}
	s.ApplyCutoffs(reps, "from Kafka topic configs and log start offsets (time window: retention.ms + segment.ms + buffer)")
}

// ApplyCutoffs compares each inbox entry's oldest key with its topic's window
// in reps (from cleanup.Cutoffs, or a cleaner's last pass), and records
// source in Snapshot.Cutoffs. Entries whose topic reps lacks get a Note.
func (s *Snapshot) ApplyCutoffs(reps []cleanup.TopicReport, source string) {
	s.Cutoffs = source
	byTopic := make(map[string]cleanup.TopicReport, len(reps))
	for _, r := range reps {
		byTopic[r.Topic] = r
	}
	for k := range s.Inbox {
		tr, ok := byTopic[s.Inbox[k].Topic]
		if !ok {
			s.Inbox[k].Note = "window unknown: no cleanup plan for this topic yet"
			continue
		}
		s.Inbox[k].applyCutoff(tr, s.Time)
	}
}

// applyCutoff sets Window, Cutoff, Margin and Note from a topic's plan.
func (in *InboxTopic) applyCutoff(tr cleanup.TopicReport, now time.Time) {
	if !tr.Timed { // exact rule only, or neither: the note says which, and why
		in.Note = tr.Note()
		return
	}
	in.Window = seconds(tr.Window)
	cut := now.Add(-tr.Window)
	in.Cutoff = &cut
	in.Margin = seconds(tr.Window - time.Duration(in.OldestAge*float64(time.Second)))
	switch {
	case tr.Forced:
		in.Note = tr.Note()
	case *in.Margin < 0:
		in.Note = "overdue: older than the window (cleanup not running?)"
	}
}
