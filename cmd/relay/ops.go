package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

// Option groups of the operator commands.
const (
	groupOps       = "Operator filters"
	groupOpsParked = "Parked rows"
	groupOpsDead   = "Dead letters"
)

// opsOptions are the operator commands' settings (parked, dead).
type opsOptions struct {
	Topic         string
	OlderThan     time.Duration
	Limit         int
	ErrorContains string
	Yes           bool
	Consumer      string
	ToTopic       string
	Again         bool
}

func (o *opsOptions) bind(s *settings, has map[string]bool) {
	if has[groupOps] {
		s.str(&o.Topic, groupOps, "topic", "PGBOX_OPS_TOPIC", "", "only rows of this topic (parked: the row's topic; dead: the topic consumed); empty: any")
		s.duration(&o.OlderThan, groupOps, "older-than", "PGBOX_OPS_OLDER_THAN", 0, 0, "only rows parked or dead-lettered at least this long ago (0: any age)")
		s.integer(&o.Limit, groupOps, "limit", "PGBOX_OPS_LIMIT", inspect.ListLimitDefault, 1, 1_000_000, "most rows `list` prints (and a discard preview shows)")
	}
	if has[groupOpsParked] {
		s.str(&o.ErrorContains, groupOpsParked, "error-contains", "PGBOX_OPS_ERROR_CONTAINS", "", "only parked rows whose last error contains this text; empty: any")
		s.boolean(&o.Yes, groupOpsParked, "yes", "PGBOX_OPS_YES", false, "confirm `discard` (without it, discard only shows what it would delete, and exits 2)")
	}
	if has[groupOpsDead] {
		s.str(&o.Consumer, groupOpsDead, "consumer", "PGBOX_OPS_CONSUMER", "", "only dead letters of this consumer (inbox.Config.Consumer); empty: any")
		s.str(&o.ToTopic, groupOpsDead, "to-topic", "PGBOX_OPS_TO_TOPIC", "", "`replay` writes to this topic instead of each dead letter's source topic")
		s.boolean(&o.Again, groupOpsDead, "again", "PGBOX_OPS_AGAIN", false, "`replay` dead letters replayed before too, as new replays (the consumer processes them once more)")
	}
}

// parseIDs reads positional row ids.
func parseIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageError("invalid id %q: ids are positive integers (see the id column of `list`)", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// cmdParked runs `parked list|retry|discard [ID...]`.
func cmdParked(ctx context.Context, a *app, args []string) error {
	if len(args) == 0 {
		return usageError("parked needs an action: list, retry or discard (see `relay parked --help`)")
	}
	action := args[0]
	if action != "list" && action != "retry" && action != "discard" {
		return usageError("unknown parked action %q (allowed: list, retry, discard)", action)
	}
	ids, err := parseIDs(args[1:])
	if err != nil {
		return err
	}
	o := a.opts.Ops
	f := inspect.ParkedFilter{Topic: o.Topic, ErrorContains: o.ErrorContains, OlderThan: o.OlderThan, IDs: ids, Limit: o.Limit}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch action {
	case "list":
		rows, err := inspect.ListParked(ctx, pool, f)
		if err != nil {
			return err
		}
		if a.opts.JSON {
			return a.printJSON(nonNilSlice(rows))
		}
		writeParked(a.stdout, rows)
		return nil
	case "retry":
		n, err := inspect.RetryParked(ctx, pool, f)
		if err != nil {
			return err
		}
		if a.opts.JSON {
			return a.printJSON(map[string]int64{"retried": n})
		}
		fmt.Fprintf(a.stdout, "retried %d parked row(s): running relays publish them again\n", n)
		return nil
	}
	return discardParked(ctx, a, pool, f)
}

func discardParked(ctx context.Context, a *app, pool inspect.Querier, f inspect.ParkedFilter) error {
	o := a.opts.Ops
	if o.Yes {
		n, err := inspect.DiscardParked(ctx, pool, f)
		if err != nil {
			return err
		}
		if a.opts.JSON {
			return a.printJSON(map[string]int64{"discarded": n})
		}
		fmt.Fprintf(a.stdout, "discarded %d parked row(s)\n", n)
		return nil
	}
	n, err := inspect.CountParked(ctx, pool, f)
	if err != nil {
		return err
	}
	rows, err := inspect.ListParked(ctx, pool, f)
	if err != nil {
		return err
	}
	if a.opts.JSON {
		if err := a.printJSON(map[string]any{"dry_run": true, "would_discard": n, "rows": nonNilSlice(rows)}); err != nil {
			return err
		}
	} else {
		writeParked(a.stdout, rows)
		fmt.Fprintf(a.stdout, "would discard %d parked row(s)\n", n)
	}
	return usageError("discard: nothing deleted: add --yes to delete the %d row(s) shown", n)
}

func writeParked(w io.Writer, rows []inspect.ParkedMessage) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no parked rows")
		return
	}
	fmt.Fprintf(w, "%-10s %-30s %-8s %-8s %-20s %s\n", "ID", "TOPIC", "ATTEMPTS", "HELD", "PARKED AT", "LAST ERROR")
	for _, r := range rows {
		fmt.Fprintf(w, "%-10d %-30s %-8d %-8d %-20s %s\n", r.ID, r.Topic, r.Attempts, r.Held, r.ParkedAt.UTC().Format(time.DateTime), r.LastError)
	}
}

// cmdDead runs `dead list|replay [ID...]`.
func cmdDead(ctx context.Context, a *app, args []string) error {
	if len(args) == 0 {
		return usageError("dead needs an action: list or replay (see `relay dead --help`)")
	}
	action := args[0]
	if action != "list" && action != "replay" {
		return usageError("unknown dead action %q (allowed: list, replay)", action)
	}
	ids, err := parseIDs(args[1:])
	if err != nil {
		return err
	}
	o := a.opts.Ops
	if action == "replay" && len(ids) == 0 {
		return usageError("dead replay needs the ids of the dead letters to replay (see `relay dead list`)")
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if action == "list" {
		f := inspect.DeadFilter{Consumer: o.Consumer, Topic: o.Topic, OlderThan: o.OlderThan, IDs: ids, Limit: o.Limit}
		rows, err := inspect.ListDead(ctx, pool, f)
		if err != nil {
			return err
		}
		if a.opts.JSON {
			return a.printJSON(nonNilSlice(rows))
		}
		writeDead(a.stdout, rows)
		return nil
	}
	res, err := inspect.ReplayDead(ctx, pool, ids, inspect.ReplayOptions{ToTopic: o.ToTopic, Again: o.Again})
	if err != nil {
		return err
	}
	if a.opts.JSON {
		return a.printJSON(map[string]any{"replays": res})
	}
	for _, r := range res {
		if r.Skipped {
			fmt.Fprintf(a.stdout, "dead letter %d: replayed before, skipped (--again replays it once more)\n", r.ID)
		} else {
			fmt.Fprintf(a.stdout, "dead letter %d: replayed to %s (%s: %s)\n", r.ID, r.Topic, "pgbox-replay-of", r.ReplayOf)
		}
	}
	return nil
}

func writeDead(w io.Writer, rows []inspect.DeadLetter) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return
	}
	fmt.Fprintf(w, "%-8s %-20s %-30s %-20s %-20s %-8s %s\n", "ID", "CONSUMER", "SOURCE", "DEAD AT", "REPLAYED AT", "REPLAYS", "ERROR")
	for _, r := range rows {
		replayed := "-"
		if r.ReplayedAt != nil {
			replayed = r.ReplayedAt.UTC().Format(time.DateTime)
		}
		src := fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
		fmt.Fprintf(w, "%-8d %-20s %-30s %-20s %-20s %-8d %s\n", r.ID, r.Consumer, src, r.DeadAt.UTC().Format(time.DateTime), replayed, r.Replays, r.Error)
	}
}

func nonNilSlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

const parkedDoc = `Parked outbox rows (rows the relay gave up on after its attempts):
  list              print the rows the filters select, in id order (--limit)
  retry [ID...]     unpark them: attempts restart at 0, running relays publish
                    them again, in id order among themselves
  discard [ID...]   delete them (their events are never published); without
                    --yes it prints what it would delete and exits 2
IDs, when given, restrict the action to those rows. Safe while relays run:
batches of 500 rows, each re-checking that its rows are still parked.
Idempotent: running a command twice leaves the same end state.`

const deadDoc = `Dead-lettered consumer messages (pgbox_consumer_dead):
  list              print the dead letters the filters select, in id order
  replay ID...      write each one's record (key, value, headers) through the
                    outbox to its source topic (or --to-topic) with the header
                    pgbox-replay-of: <id>, and mark it replayed, in one
                    transaction. The consumer's inbox processes the replay
                    under a key of its own (key + "/replay/" + id), once; a
                    rewind over the original record still skips it. A dead
                    letter replayed before is skipped unless --again.
Exit codes: 0 success, 1 failure (an unknown id), 2 bad flags or arguments.`
