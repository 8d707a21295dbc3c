package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

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
	res, err := inspect.ReplayDead(ctx, pool, ids, inspect.ReplayConfig{ToTopic: o.ToTopic, Again: o.Again})
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
