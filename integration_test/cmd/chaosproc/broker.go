package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

// runBroker runs one kfake broker on a fixed port with a data directory and
// an fsync per write, so that a kill -9 loses nothing it acknowledged and a
// restart on the same port finds its topics, records and group offsets.
// --sync-writes=false leaves the fsync to the OS, as Kafka does by default
// (log.flush.interval.messages unset): a scenario that never kills the
// broker and sends to hundreds of partitions at once (make tenants) then
// measures the relay, not one fsync per partition a request.
// Retention is applied when SIGUSR1 arrives (the harness decides when
// Kafka's retention check runs); SIGTERM closes it cleanly.
func runBroker(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	dir := fs.String("data-dir", "", "persistence directory (required)")
	port := fs.Int("port", 0, "loopback port (required)")
	syncWrites := fs.Bool("sync-writes", true, "fsync every write (false: as Kafka's default, the OS flushes)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *port == 0 {
		return fmt.Errorf("broker: --data-dir and --port are required")
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(*port), kfake.DataDir(*dir),
		kfake.BrokerConfigs(map[string]string{"log.retention.ms": "-1"})}
	if *syncWrites {
		opts = append(opts, kfake.SyncWrites())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("broker: start on port %d with data dir %s: %w", *port, *dir, err)
	}
	defer c.Close()
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	log.Info("broker ready", "addrs", c.ListenAddrs(), "data_dir", *dir)
	fmt.Println("ready")
	for {
		select {
		case <-ctx.Done():
			log.Info("broker stopping")
			return nil
		case <-usr1:
			c.ApplyRetention()
			log.Info("retention applied")
			fmt.Println("retention applied")
		}
	}
}
