package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"github.com/pgbox/pgbox/internal/dbconf"
)

const targetsDoc = `Print the target list as the commands that read it see it: each target's
name, schema and database (password masked), from --targets, --targets-query
or, without either, the one target of --database-url and --schema.
  list      read the list once, check it and print it
  watch     print it, then re-read it every --targets-refresh and print each
            change as it is seen ("+ name schema database" for a target added,
            "- …" for one removed; a changed target is both) until SIGINT or
            SIGTERM. A failed re-read is logged once and the previous list kept`

// cmdTargets prints the target list, once (list) or as it changes (watch).
func cmdTargets(ctx context.Context, a *app, args []string) error {
	if len(args) != 1 || (args[0] != "list" && args[0] != "watch") {
		return usageError("targets needs one argument: list or watch (got %q)", args)
	}
	if args[0] == "list" {
		list, err := loadTargets(ctx, a)
		if err != nil {
			return err
		}
		return printTargets(a.stdout, list)
	}
	var mu sync.Mutex
	var last []targetSpec
	mu.Lock() // a change is printed after the first list
	list, done, err := watchTargets(ctx, a, func(next []targetSpec) {
		mu.Lock()
		defer mu.Unlock()
		added, removed := diffTargets(last, next)
		for _, t := range removed {
			fmt.Fprintf(a.stdout, "- %s %s %s\n", t.display(), targetSchema(t), dbconf.RedactDSN(t.DatabaseURL))
		}
		for _, t := range added {
			fmt.Fprintf(a.stdout, "+ %s %s %s\n", t.display(), targetSchema(t), dbconf.RedactDSN(t.DatabaseURL))
		}
		last = next
	})
	if err != nil {
		mu.Unlock()
		return err
	}
	last = list
	err = printTargets(a.stdout, list)
	mu.Unlock()
	if err != nil {
		return err
	}
	a.log.Info("watching the target list", "targets", len(list), "refresh", fmtDuration(a.opts.Targets.Refresh))
	<-ctx.Done()
	<-done
	return nil
}

func printTargets(out io.Writer, list []targetSpec) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSCHEMA\tDATABASE")
	for _, t := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.display(), targetSchema(t), dbconf.RedactDSN(t.DatabaseURL))
	}
	return tw.Flush()
}

// targetSchema is the target's schema as tables print it ("-": the
// connection's own search_path).
func targetSchema(t targetSpec) string {
	if t.Schema == "" {
		return "-"
	}
	return t.Schema
}
