package integration_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
)

// Environment knobs of the chaos run; `make chaos` sets CHAOS_SCALE=large.
const (
	envScale   = "CHAOS_SCALE"          // small (default, part of `make test`) or large (`make chaos`)
	envSeed    = "CHAOS_SEED"           // replay a run's fault schedule
	envEvents  = "CHAOS_EVENTS"         // override the event count (1000000 for the big run)
	envPerKind = "CHAOS_PER_KIND"       // override how many times each fault kind is injected
	envRace    = "CHAOS_RACE"           // 1: build the processes with the race detector
	envKeep    = "CHAOS_KEEP"           // 1: keep the working directory even when the run passes
	envBuffer  = "CHAOS_CLEANUP_BUFFER" // the cleanup faults' --cleanup-buffer (default 1s)
	envDedup   = "CHAOS_DEDUP"          // the payments inbox: keys (default) or watermark
)

// TestChaos runs orders → relays → Kafka → payments group → relays → Kafka
// as real processes, injects every fault kind on a seeded schedule while
// orders flow, and checks: no lost event, no duplicate business effect, no
// per-key order inversion, and progress resumes after every fault.
func TestChaos(t *testing.T) {
	watermark := false
	switch v := os.Getenv(envDedup); v {
	case "", "keys":
	case "watermark":
		watermark = true
	default:
		t.Fatalf("%s=%q: want keys or watermark", envDedup, v)
	}
	chaos(t, watermark)
}

// TestChaosWatermark is the small chaos run with the payments inbox in
// offset-watermark mode (inbox.DedupWatermarkAndKeys). The large one:
// CHAOS_DEDUP=watermark make chaos.
func TestChaosWatermark(t *testing.T) {
	chaos(t, true)
}

func chaos(t *testing.T, watermark bool) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	cfg := harness.Config{Events: 3000, PerKind: 2, Gap: 3 * time.Second}
	opts := harness.Options{Race: os.Getenv(envRace) == "1", Retention: 10 * time.Second, Watermark: watermark}
	if os.Getenv(envScale) == "large" {
		cfg = harness.Config{Events: 200_000, PerKind: 5, Gap: 8 * time.Second}
		// Consumers lag more under load: the cleanup fault waits for them
		// to pass the retention edge.
		opts.Retention = 30 * time.Second
	}
	cfg.Seed = uint64(time.Now().UnixNano())
	envInt(t, envSeed, func(n int64) { cfg.Seed = uint64(n) })
	envInt(t, envEvents, func(n int64) { cfg.Events = n })
	envInt(t, envPerKind, func(n int64) { cfg.PerKind = int(n) })
	fmt.Printf("chaos: seed %d (replay with %s=%d), watermark mode %v\n", cfg.Seed, envSeed, cfg.Seed, watermark)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	if v := os.Getenv(envBuffer); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: must be a positive duration like 1s or 2m", envBuffer, v)
		}
		opts.CleanupBuffer = d
	}
	opts.Logf = func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	w, err := harness.NewWorld(ctx, opts)
	if err != nil {
		t.Fatalf("chaos: start the chain: %v", err)
	}
	rep, err := w.Run(ctx, cfg)
	rep.Print(os.Stdout)
	if err == nil && watermark {
		// The mode was in effect: a watermark row per partition consumed.
		n, werr := w.WatermarkRows(ctx)
		if werr != nil || n == 0 {
			rep.Violations = append(rep.Violations, fmt.Sprintf("watermark mode left %d watermark rows (%v)", n, werr))
		}
	}
	keep := err != nil || !rep.OK() || os.Getenv(envKeep) == "1"
	w.Close(keep)
	if keep {
		fmt.Printf("chaos: logs and data kept in %s\n", w.Dir)
	}
	if err != nil {
		t.Fatalf("chaos run (seed %d) did not complete: %v\nlogs: %v", cfg.Seed, err, rep.Logs)
	}
	if !rep.OK() {
		t.Fatalf("chaos run (seed %d) broke a guarantee: %v %v %v\nlogs: %v", cfg.Seed, rep.Violations, rep.Verdict.First, rep.Stalls, rep.Logs)
	}
}

func envInt(t *testing.T, name string, set func(int64)) {
	v := os.Getenv(name)
	if v == "" {
		return
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: must be a positive integer", name, v)
	}
	set(n)
}
