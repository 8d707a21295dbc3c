// Command chaosproc is the set of processes the chaos harness
// (integration_test/) runs besides the real relay binary:
//
//	chaosproc broker    the embedded Kafka broker (kfake) with a data dir and fsync per write
//	chaosproc orders    the orders service: one tx per order (business row + outbox.Write)
//	chaosproc payments  one member of the payments service's consumer group (inbox + effect + outbox)
//
// Each logs to stderr with slog and exits 0 on SIGTERM/SIGINT. It is a test
// program: it may import the embedded broker.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgbox/pgbox/migrations"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: chaosproc broker|orders|payments [flags]")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "broker":
		err = runBroker(ctx, log, os.Args[2:])
	case "orders":
		err = runOrders(ctx, log, os.Args[2:])
	case "payments":
		err = runPayments(ctx, log, os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want broker, orders or payments)", os.Args[1])
	}
	if err != nil && ctx.Err() == nil {
		log.Error("chaosproc "+os.Args[1]+" failed", "err", err)
		os.Exit(1)
	}
}

// checkSchema is what a service embedding pgbox does at start-up: refuse a
// database whose pgbox schema is older than the pgbox it was built with
// ("run `relay migrate up`"), before it writes or consumes anything.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Check(ctx, db)
}
