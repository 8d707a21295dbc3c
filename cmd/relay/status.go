package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/relay"
)

// schemaHint turns "relation does not exist" into inspect's advice.
func schemaHint(err error) error {
	if pgerr.IsUndefinedTable(err) {
		return fmt.Errorf("%w (%w)", err, inspect.ErrSchemaMissing)
	}
	return err
}

// allHolders lists every holder of the xmin horizon in `status --json`:
// there are at most max_connections sessions plus the slots and prepared
// transactions, and a program reading the JSON picks its own.
const allHolders = 1 << 20

// cmdStatus prints inspect.Read's snapshot: as text (the xmin horizon's
// inspect.HorizonListDefault oldest holders), or with --json as the
// snapshot's JSON (what a service gets from inspect.Read; every holder).
// With a target list it prints one line per target, or one target's
// snapshot when named (statusfleet.go).
func cmdStatus(ctx context.Context, a *app, args []string) error {
	if a.opts.Targets.listed() {
		return statusTargets(ctx, a, args)
	}
	if len(args) > 0 {
		return usageError("status takes a target name only with --targets or --targets-query; without them it takes no arguments (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return printStatus(ctx, a, pool)
}

// printStatus reads the snapshot of the pool's database (its pgbox tables
// on the pool's search_path) and prints it.
func printStatus(ctx context.Context, a *app, pool *pgxpool.Pool) error {
	opts := inspect.Config{Lanes: relay.LanesDefault, Logger: a.log.With("component", "status")}
	if len(a.opts.Kafka.Brokers) > 0 {
		kcfg, err := a.opts.Kafka.Sarama()
		if err != nil {
			return err
		}
		lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
		defer lk.Close()
		cc := a.cleanupConfig(nil, lk, true).CutoffsConfig()
		opts.Cutoffs = &cc
	}
	if a.opts.JSON {
		opts.HorizonList = allHolders
	}
	snap, err := inspect.Read(ctx, pool, opts)
	if err != nil {
		return err
	}
	if len(a.opts.Kafka.Brokers) == 0 {
		snap.Cutoffs = "unknown: set KAFKA_BROKERS to compare inbox ages with each topic's retention window"
	}
	if a.opts.JSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(snap)
	}
	snap.WriteText(a.stdout)
	return nil
}
