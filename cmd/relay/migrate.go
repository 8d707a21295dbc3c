package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/pgbox/pgbox/migrations"
)

func cmdMigrate(ctx context.Context, a *app, args []string) error {
	if len(args) != 1 || (args[0] != "up" && args[0] != "down" && args[0] != "status") {
		return usageError("migrate needs one argument: up, down or status (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := sqlDB(pool)
	defer db.Close()
	switch args[0] {
	case "up":
		if err := migrations.Up(ctx, db); err != nil {
			return err
		}
		a.log.Info("migrations applied", "schema_version", schemaVersion())
		fmt.Fprintf(a.stdout, "pgbox schema is at version %s\n", schemaVersion())
	case "down":
		if err := migrations.Down(ctx, db); err != nil {
			return err
		}
		a.log.Warn("migrations rolled back: pgbox tables dropped")
		fmt.Fprintln(a.stdout, "pgbox schema rolled back (tables dropped)")
	case "status":
		st, err := migrations.Status(ctx, db)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range st {
			applied := "-"
			if !s.AppliedAt.IsZero() {
				applied = s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, applied, s.Source.Path)
		}
		return tw.Flush()
	}
	return nil
}
