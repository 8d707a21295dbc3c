package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/pgbox/pgbox/migrations"
)

// Option group of `migrate`.
const groupMigrate = "Migrate down"

func cmdMigrate(ctx context.Context, a *app, args []string) error {
	if len(args) != 1 || (args[0] != "up" && args[0] != "down" && args[0] != "status") {
		return usageError("migrate needs one argument: up, down or status (got %q)", args)
	}
	if a.opts.Targets.listed() {
		return migrateTargets(ctx, a, args[0])
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
		return nil
	case "down":
		return migrateDown(ctx, a, db)
	}
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

// migrateDown rolls back one migration, with the library's checks: the
// flags only confirm what migrations.Down would otherwise refuse.
func migrateDown(ctx context.Context, a *app, db *sql.DB) error {
	o := a.opts.Ops
	plan, err := migrations.Down(ctx, db, migrations.DownConfig{Yes: o.Yes, Force: o.Force})
	switch {
	case errors.Is(err, migrations.ErrNothingToRollBack):
		fmt.Fprintln(a.stdout, "nothing to roll back: no pgbox migration is applied")
		return nil
	case errors.Is(err, migrations.ErrRelayRunning):
		return usageError("migrate down: refused, nothing rolled back: relay instance(s) %s are running (registered in pgbox_relay_instances with an unexpired lease): stop them first, or add --force",
			strings.Join(plan.LiveInstances, ", "))
	case errors.Is(err, migrations.ErrDataLoss):
		return usageError("migrate down: refused, nothing rolled back: rolling back %s would drop %s: add --yes to confirm",
			plan.Source, plan.LossText())
	case err != nil:
		return err
	}
	if len(plan.Losses) > 0 {
		a.log.Warn("migration rolled back, data dropped", "migration", plan.Source, "lost", plan.LossText())
	} else {
		a.log.Warn("migration rolled back", "migration", plan.Source)
	}
	fmt.Fprintf(a.stdout, "rolled back %s", plan.Source)
	if len(plan.Losses) > 0 {
		fmt.Fprintf(a.stdout, " (dropped %s)", plan.LossText())
	}
	fmt.Fprintln(a.stdout, "; `relay migrate down` again rolls back the next one")
	return nil
}

const migrateDoc = `Apply (up), roll back one (down) or list (status) pgbox's migrations.
  up        apply every pending migration
  down      roll back the newest applied migration, one version per run, as
            goose's down does. Refused, with nothing changed (exit 2), while a
            relay instance is registered with an unexpired lease (--force
            overrides), and when the step would drop a table holding rows or
            columns of one: it names how many outbox rows, inbox keys, dead
            letters… would be lost (--yes confirms)
  status    list the migrations and whether each is applied; writes nothing
With a target list (--targets or --targets-query), up and status work on
every target, --migrate-concurrency at a time, and print one line per target:
up creates a target's schema if it does not exist, goes on past a target that
fails and exits 1 if any did (run it again to resume: targets already at the
binary's version are left as they are); status prints each target's version
and whether it is behind, current or ahead of the binary. down is refused
(exit 2): roll targets back one at a time with --database-url and --schema.`
