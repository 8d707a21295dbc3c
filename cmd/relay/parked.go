package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

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
	if action == "list" {
		rows, err := inspect.ListParked(ctx, pool, f)
		if err != nil {
			return err
		}
		if a.opts.JSON {
			return a.printJSON(nonNilSlice(rows))
		}
		writeParked(a.stdout, rows)
		return nil
	}
	if err := requireParked(ctx, pool, ids); err != nil {
		return err
	}
	if action == "retry" {
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

// requireParked fails, naming them, when ids that an operator gave are not
// parked rows (a typo, or a row published or discarded since), as `dead
// replay` does for an unknown dead letter: a command that acted on nothing
// must not report success.
func requireParked(ctx context.Context, pool inspect.Querier, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := inspect.ListParked(ctx, pool, inspect.ParkedFilter{IDs: ids, Limit: len(ids)})
	if err != nil {
		return err
	}
	var missing []string
	for _, id := range ids {
		if !slices.ContainsFunc(rows, func(r inspect.ParkedMessage) bool { return r.ID == id }) {
			missing = append(missing, strconv.FormatInt(id, 10))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no such parked row %s (see `relay parked list`): nothing changed", strings.Join(missing, ", "))
	}
	return nil
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
		fmt.Fprintf(a.stdout, "would discard %d parked row(s)%s\n", n, shownOf(len(rows), n))
	}
	return usageError("discard: nothing deleted: add --yes to delete the %d row(s) selected%s", n, shownOf(len(rows), n))
}

// shownOf says how many of n selected rows a preview listed, when --limit
// cut it short.
func shownOf(shown int, n int64) string {
	if int64(shown) >= n {
		return ""
	}
	return fmt.Sprintf(" (%d shown: --limit)", shown)
}

func writeParked(w io.Writer, rows []inspect.ParkedMessage) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no parked rows")
		return
	}
	fmt.Fprintf(w, "%-10s %-30s %-8s %-8s %-20s %s\n", "ID", "TOPIC", "ATTEMPTS", "HELD", "PARKED AT", "LAST ERROR")
	for _, r := range rows {
		held := strconv.FormatInt(r.Held, 10)
		if r.HeldCapped { // a lower bound: the count read inspect.HeldScanDefault rows of the slot
			held = ">=" + held
		}
		fmt.Fprintf(w, "%-10d %-30s %-8d %-8s %-20s %s\n", r.ID, r.Topic, r.Attempts, held, r.ParkedAt.UTC().Format(time.DateTime), r.LastError)
	}
}

var parkedDoc = `Parked outbox rows (rows the relay gave up on after its attempts):
  list              print the rows the filters select, in id order (--limit);
                    HELD counts the later rows of each one's topic and key it
                    holds back, among the next ` + strconv.Itoa(inspect.HeldScanDefault) + ` rows of its slot (>=n: the
                    count stopped there)
  retry [ID...]     unpark them: attempts restart at 0, running relays publish
                    them again, in id order among themselves
  discard [ID...]   delete them (their events are never published); without
                    --yes it prints what it would delete and exits 2
IDs, when given, restrict the action to those rows; an ID that is not a
parked row fails retry and discard (exit 1) with nothing changed. The
discard preview counts every selected row and lists at most --limit of them.
Safe while relays run: batches of 500 rows, each re-checking that its rows
are still parked. Idempotent: running a command twice leaves the same end
state (with IDs, the second run fails naming the rows no longer parked).`
