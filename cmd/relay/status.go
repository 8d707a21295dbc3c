package main

import (
	"context"
	"encoding/json"
	"fmt"

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
func cmdStatus(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("status takes no arguments (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
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
