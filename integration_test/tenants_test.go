package integration_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/integration_test/internal/harness"
	"github.com/pgbox/pgbox/internal/pgcluster"
	"github.com/pgbox/pgbox/outbox"
)

// Knobs of the many-tenants scenario (issue 35); `make tenants` sets
// TENANTS_SCALE=large and TENANTS_DOC=docs/tenants-scale.md.
const (
	envTenantsScale      = "TENANTS_SCALE"       // small or large; unset: the test is skipped
	envTenantsSchemas    = "TENANTS_SCHEMAS"     // schema targets in the one large database
	envTenantsDBs        = "TENANTS_DBS"         // further databases
	envTenantsDBSchemas  = "TENANTS_DB_SCHEMAS"  // schema targets in each further database
	envTenantsActive     = "TENANTS_ACTIVE"      // targets written to in the active phase (in the large database)
	envTenantsRate       = "TENANTS_RATE"        // writer transactions per second in the active phase (one event each)
	envTenantsBacklog    = "TENANTS_BACKLOG"     // rows of the drained backlog
	envTenantsBudget     = "TENANTS_CONN_BUDGET" // the fleet's --db-conn-budget (default: 10 per database, as a single relay's pool)
	envTenantsWarmup     = "TENANTS_WARMUP"      // excluded before the idle and active figures (Go duration)
	envTenantsIdle       = "TENANTS_IDLE"        // how long the idle cost is measured
	envTenantsActiveFor  = "TENANTS_ACTIVE_FOR"  // how long the active phase is measured
	envTenantsDoc        = "TENANTS_DOC"         // write the report as markdown to this file
	envTenantsDormant    = "TENANTS_DORMANT"     // the fleet's --dormant-after (Go duration; 0s: never)
	envTenantsKeepLogs   = "TENANTS_KEEP_LOGS"   // copy the relays' and the broker's logs into this directory at the end
	envTenantsBrokerSync = "TENANTS_BROKER_SYNC" // 1: the broker fsyncs every write (the chaos scenarios' broker)
)

// tenantsScale is one size of the scenario.
type tenantsScale struct {
	Schemas   int // schema targets in the large database
	DBs       int // further databases
	DBSchemas int // schema targets in each further database
	Active    int // active targets
	Rate      int // writer transactions per second, active phase
	Backlog   int // rows drained
	Budget    int // --db-conn-budget
	Warmup    time.Duration
	Idle      time.Duration
	ActiveFor time.Duration
	Drain     time.Duration // how long a drain, or the last events of an active phase, may take before they count as lost
	Dormant   time.Duration // the fleet's --dormant-after; its idle phase starts that long (plus 10 s) after the warm-up
}

func (sc tenantsScale) targets() int { return sc.Schemas + sc.DBs*sc.DBSchemas }

const (
	tenantsDB          = "tenants" // the large database
	tenantsPartitions  = 3
	tenantsSoloSchema  = "solo"  // the baseline's schema: in the large database, not in the fleet's list
	tenantsAddedSchema = "added" // the target added to the running fleet: in the large database
	tenantsValuePrefix = "seq=000000000000 tenant="
)

// tenantTarget is one target of the scenario.
type tenantTarget struct {
	name, schema, db string
}

func tenantsTopic(name string) string { return "tenant." + name }

// tenantValue is a 200-byte value that starts as pressureValue does and
// names the tenant whose table the row was written to.
func tenantValue(seq int64, tenant string) []byte {
	v := make([]byte, 0, pressureValueBytes)
	v = fmt.Appendf(v, "%s%0*d tenant=%s ", pressureSeqPrefix, pressureSeqDigits, seq, tenant)
	for len(v) < pressureValueBytes {
		v = append(v, 'x')
	}
	return v
}

// tenantOf reads the tenant a value names.
func tenantOf(v []byte) (string, bool) {
	if len(v) < len(tenantsValuePrefix) {
		return "", false
	}
	rest := string(v[len(tenantsValuePrefix):])
	name, _, ok := strings.Cut(rest, " ")
	return name, ok
}

// tenantBulkSQL inserts $1 rows in the outbox of the transaction's
// search_path, topic $4, values as tenantValue's for tenant $6 from sequence
// number $5, keys $2 with slots $3.
const tenantBulkSQL = `INSERT INTO pgbox_outbox (event_id, slot, topic, key, value)
SELECT gen_random_uuid(), ($3::int[])[1 + g % cardinality($2::text[])], $4,
	convert_to(($2::text[])[1 + g % cardinality($2::text[])], 'UTF8'),
	convert_to(rpad('seq=' || lpad(($5::bigint + g)::text, 12, '0') || ' tenant=' || $6 || ' ', 200, 'x'), 'UTF8')
FROM generate_series(0, $1::int - 1) g`

// TestTenants measures one `relay run --targets` process serving many
// targets (issue 35): TENANTS_SCHEMAS schema targets in one database plus
// TENANTS_DBS databases of TENANTS_DB_SCHEMAS schemas each (1,000 + 20 × 10
// at TENANTS_SCALE=large), on a private PostgreSQL cluster and broker
// process, measured from outside (pg_stat_database, pg_stat_statements,
// pg_stat_activity, /proc, the relay's /metrics, a separate Kafka consumer):
//
//   - memory: the same binary serving one target (a one-line list), idle;
//   - baseline: a plain single-target `relay run --schema` drains a backlog
//     of TENANTS_BACKLOG rows (clock from the process start to the last
//     record seen by the consumer), then serves TENANTS_RATE tx/s (one
//     event each, outbox.Config.Notify) into its one schema: commit→Kafka
//     p50/p99/max;
//   - fleet: the fleet relay starts over every target, one of which holds
//     the same backlog (its drain timed the same way), then all targets
//     idle: transactions and statements per second per target, the
//     connections it holds, its CPU, RSS and Go heap (memory per target:
//     its RSS minus the one-target RSS, over targets - 1); then the same
//     rate spread over TENANTS_ACTIVE targets of the large database while
//     the others idle.
//
// It fails only on correctness: an event lost, or a record whose topic is
// not the one of the tenant its value names. Timings never fail it.
func TestTenants(t *testing.T) {
	var sc tenantsScale
	switch v := os.Getenv(envTenantsScale); v {
	case "":
		t.Skipf("set %s=small or large (make tenants) to run the many-tenants scale test", envTenantsScale)
	case "small":
		sc = tenantsScale{Schemas: 20, DBs: 2, DBSchemas: 2, Active: 10, Rate: 200, Backlog: 5000,
			Warmup: 3 * time.Second, Idle: 5 * time.Second, ActiveFor: 5 * time.Second, Drain: 2 * time.Minute, Dormant: 2 * time.Second}
	case "large":
		sc = tenantsScale{Schemas: 1000, DBs: 20, DBSchemas: 10, Active: 100, Rate: 1000, Backlog: 100_000,
			Warmup: 10 * time.Second, Idle: 60 * time.Second, ActiveFor: 60 * time.Second, Drain: 5 * time.Minute, Dormant: time.Minute}
	default:
		t.Fatalf("%s=%q: want small or large", envTenantsScale, v)
	}
	envInt(t, envTenantsSchemas, func(n int64) { sc.Schemas = int(n) })
	envInt(t, envTenantsDBs, func(n int64) { sc.DBs = int(n) })
	envInt(t, envTenantsDBSchemas, func(n int64) { sc.DBSchemas = int(n) })
	envInt(t, envTenantsActive, func(n int64) { sc.Active = int(n) })
	envInt(t, envTenantsRate, func(n int64) { sc.Rate = int(n) })
	envInt(t, envTenantsBacklog, func(n int64) { sc.Backlog = int(n) })
	envInt(t, envTenantsBudget, func(n int64) { sc.Budget = int(n) })
	envDuration(t, envTenantsWarmup, &sc.Warmup)
	envDuration(t, envTenantsIdle, &sc.Idle)
	envDuration(t, envTenantsActiveFor, &sc.ActiveFor)
	envDuration(t, envTenantsDormant, &sc.Dormant)
	if sc.Schemas < 2 {
		t.Fatalf("%s=%d: at least 2 (active targets and the drained one)", envTenantsSchemas, sc.Schemas)
	}
	sc.Active = min(sc.Active, sc.Schemas-1) // the last schema holds the backlog
	if sc.Budget == 0 {
		sc.Budget = 1 + (1+sc.DBs)*(10+1) // the check connection, then per database a pool of 10 and LISTEN
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	tn := startTenants(ctx, t, sc)
	rep := tn.run(ctx)
	rep.print(os.Stdout)
	if path := os.Getenv(envTenantsDoc); path != "" {
		require.NoError(t, os.WriteFile(path, []byte(rep.markdown()), 0o644), envTenantsDoc)
		fmt.Printf("tenants: report written to %s\n", path)
	}
	require.Empty(t, rep.Misrouted, "records published under another tenant's topic")
	require.Empty(t, rep.Lost)
}

// tenants is one running scenario.
type tenants struct {
	t       *testing.T
	sc      tenantsScale
	dir     string
	bin     harness.Binaries
	pg      *pgcluster.Cluster
	broker  *harness.Proc
	addr    string // the broker's
	relay   *harness.Proc
	stats   *pgx.Conn // on the postgres database, outside the scenario's
	dbs     []string  // the scenario's databases
	fleet   []tenantTarget
	actives []tenantTarget
	drained tenantTarget
	added   tenantTarget // in no list the fleet starts with: added while it runs
	files   struct{ all, fleet, one string }
	seq     atomic.Int64
	m       *meter
	rep     *tenantsReport

	mu        sync.Mutex
	misrouted []string
	checked   atomic.Int64
}

// tenantsPGSettings are TENANTS_PG_SETTINGS's lines (settings separated by
// ";"), added after the scenario's own for a diagnosis (a later line wins):
// "pg_stat_statements.track = all" shows the statements inside the claim.
func tenantsPGSettings() []string {
	var out []string
	for _, s := range strings.Split(os.Getenv("TENANTS_PG_SETTINGS"), ";") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func startTenants(ctx context.Context, t *testing.T, sc tenantsScale) *tenants {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgbox-tenants-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755)) // PostgreSQL runs as another user when we are root
	tn := &tenants{t: t, sc: sc, dir: dir, rep: &tenantsReport{Scale: sc, Started: time.Now(), Commit: gitDescribe()}}
	t.Cleanup(func() { tn.close() })
	tn.bin, err = harness.Build(ctx, filepath.Join(dir, "bin"), false)
	require.NoError(t, err)

	tn.pg, err = pgcluster.Start(ctx, pgcluster.Config{Dir: filepath.Join(dir, "pg"), Settings: append([]string{
		"fsync = off", "shared_buffers = 128MB", "max_wal_size = 2GB", "max_connections = 600",
		"shared_preload_libraries = 'pg_stat_statements'", "pg_stat_statements.track = top", "pg_stat_statements.track_planning = on", "pg_stat_statements.max = 50000"}, tenantsPGSettings()...)})
	require.NoError(t, err)
	tn.stats, err = pgx.Connect(ctx, withParam(t, tn.pg.URL("postgres"), "application_name", "tenants sampler"))
	require.NoError(t, err)
	require.NoError(t, tn.stats.QueryRow(ctx, `SHOW server_version`).Scan(&tn.rep.Postgres))
	if _, err := tn.stats.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		t.Logf("tenants: no pg_stat_statements (%v): no statements per second", err)
	} else {
		tn.rep.Statements = true
	}

	// The targets: the large database's schemas, then the other databases'.
	tn.dbs = []string{tenantsDB}
	for i := 1; i <= sc.Schemas; i++ {
		s := fmt.Sprintf("s%04d", i)
		tn.fleet = append(tn.fleet, tenantTarget{name: s, schema: s, db: tenantsDB})
	}
	for d := 1; d <= sc.DBs; d++ {
		db := fmt.Sprintf("tenants_d%02d", d)
		tn.dbs = append(tn.dbs, db)
		for i := 1; i <= sc.DBSchemas; i++ {
			s := fmt.Sprintf("s%02d", i)
			tn.fleet = append(tn.fleet, tenantTarget{name: fmt.Sprintf("d%02d_%s", d, s), schema: s, db: db})
		}
	}
	tn.actives = tn.fleet[:sc.Active]
	tn.drained = tn.fleet[sc.Schemas-1]
	for _, db := range tn.dbs {
		require.NoError(t, tn.pg.CreateDatabase(ctx, db))
	}
	solo := tenantTarget{name: tenantsSoloSchema, schema: tenantsSoloSchema, db: tenantsDB}
	tn.added = tenantTarget{name: tenantsAddedSchema, schema: tenantsAddedSchema, db: tenantsDB}
	tn.files.all = tn.writeTargets("all.txt", append(slices.Clone(tn.fleet), solo, tn.added))
	tn.files.fleet = tn.writeTargets("fleet.txt", tn.fleet)
	tn.files.one = tn.writeTargets("one.txt", tn.fleet[len(tn.fleet)-1:])

	start := time.Now()
	out, err := exec.CommandContext(ctx, tn.bin.Relay, "migrate", "up", "--targets", tn.files.all,
		"--database-url", tn.pg.URL(tenantsDB), "--migrate-concurrency", "4").CombinedOutput()
	require.NoError(t, err, "relay migrate up: %s", lastLines(out, 20))
	tn.rep.Migrate = time.Since(start)
	fmt.Printf("tenants: %d targets migrated in %v\n", len(tn.fleet)+2, tn.rep.Migrate.Round(time.Second))

	port, err := pgcluster.FreePort()
	require.NoError(t, err)
	tn.addr = "127.0.0.1:" + strconv.Itoa(port)
	tn.broker = &harness.Proc{Name: "broker", Path: tn.bin.Proc, LogPath: filepath.Join(dir, "broker.log"),
		Args: []string{"broker", "--data-dir", filepath.Join(dir, "kafka"), "--port", strconv.Itoa(port),
			// Kafka's default: the OS flushes. An fsync per write costs
			// the broker a disk flush per partition a request (about 1 ms
			// here): 100 busy targets' 300 partitions made the broker, not
			// the relay, what the active figures measured. TENANTS_BROKER_SYNC=1
			// puts it back (the chaos scenarios, which kill the broker, keep it).
			"--sync-writes=" + strconv.FormatBool(os.Getenv(envTenantsBrokerSync) == "1")}}
	require.NoError(t, tn.broker.Start())
	require.NoError(t, waitListening(ctx, tn.addr))
	var topics []string
	for _, tg := range append(slices.Clone(tn.actives), tn.drained, tn.added, solo) {
		topics = append(topics, tenantsTopic(tg.name))
	}
	admin, err := newAdmin(tn.addr)
	require.NoError(t, err)
	forever := "-1"
	for _, topic := range topics {
		require.NoError(t, admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: tenantsPartitions, ReplicationFactor: 1,
			ConfigEntries: map[string]*string{"retention.ms": &forever}}, false), topic)
	}
	require.NoError(t, admin.Close())

	tn.m = newMeter()
	tn.m.consumeTopics(ctx, t, tn.addr, topics, tn.check)
	return tn
}

// check is the consumer's correctness check: a record's topic is its
// tenant's.
func (tn *tenants) check(msg *sarama.ConsumerMessage) {
	tn.checked.Add(1)
	name, ok := tenantOf(msg.Value)
	if ok && msg.Topic == tenantsTopic(name) {
		return
	}
	tn.mu.Lock()
	defer tn.mu.Unlock()
	if len(tn.misrouted) < 10 {
		tn.misrouted = append(tn.misrouted, fmt.Sprintf("topic %s partition %d offset %d: value %.60q", msg.Topic, msg.Partition, msg.Offset, msg.Value))
	}
}

func (tn *tenants) writeTargets(name string, list []tenantTarget) string {
	var b strings.Builder
	for _, tg := range list {
		fmt.Fprintf(&b, "%s %s %s\n", tg.name, tg.schema, tn.pg.URL(tg.db))
	}
	// Replaced, not rewritten in place: a running fleet re-reading the
	// file reads the old list or the new one, never half of it.
	path := filepath.Join(tn.dir, name)
	require.NoError(tn.t, os.WriteFile(path+".new", []byte(b.String()), 0o644))
	require.NoError(tn.t, os.Rename(path+".new", path))
	return path
}

func (tn *tenants) close() {
	if tn.m != nil {
		tn.m.close()
	}
	if tn.stats != nil {
		_ = tn.stats.Close(context.Background())
	}
	if dir := os.Getenv(envTenantsKeepLogs); dir != "" && tn.dir != "" {
		logs, _ := filepath.Glob(filepath.Join(tn.dir, "*.log"))
		for _, l := range logs {
			if b, err := os.ReadFile(l); err == nil {
				_ = os.WriteFile(filepath.Join(dir, filepath.Base(l)), b, 0o644)
			}
		}
	}
	tearDown(tn.t, "tenants", 30*time.Second, tn.pg, tn.dir, tn.relay, tn.broker)
}

// run drives the phases.
func (tn *tenants) run(ctx context.Context) *tenantsReport {
	t, sc, rep := tn.t, tn.sc, tn.rep
	rep.LoadStart = loadAverage()
	rep.Settings = relaySettings(os.Environ())
	keys, slots := tenantsKeys()
	// The two backlogs, written while no relay runs.
	backlog := func(tg tenantTarget) *burstRange {
		b := tn.m.watchBurst("backlog "+tg.name, tn.reserve(int64(sc.Backlog)), int64(sc.Backlog))
		conn, err := pgx.Connect(ctx, tn.pg.URL(tg.db))
		require.NoError(t, err)
		defer conn.Close(context.Background())
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{tg.schema}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, tenantBulkSQL, sc.Backlog, keys, slots, tenantsTopic(tg.name), b.first, tg.name)
			return err
		})
		require.NoError(t, err, "backlog of %d rows in %s", sc.Backlog, tg.schema)
		tn.m.committedRange(b, time.Now())
		return b
	}
	soloTarget := tenantTarget{name: tenantsSoloSchema, schema: tenantsSoloSchema, db: tenantsDB}
	soloBacklog, fleetBacklog, addedBacklog := backlog(soloTarget), backlog(tn.drained), backlog(tn.added)

	// Memory of the binary serving a one-line list.
	fmt.Printf("tenants: one target, idle (load %s)\n", loadAverage())
	tn.startRelay("relay-one", "run", "--targets", tn.files.one, "--db-conn-budget", strconv.Itoa(sc.Budget))
	tn.sleep(ctx, sc.Warmup+sc.Idle/4)
	rep.One = tn.procSample()
	tn.stopRelay()

	// The baseline: a plain single-target relay.
	fmt.Printf("tenants: baseline drain (load %s)\n", loadAverage())
	rep.Base.Drain = tn.drain(ctx, soloBacklog, func() {
		tn.startRelay("relay-solo", "run", "--database-url", tn.pg.URL(tenantsDB), "--schema", tenantsSoloSchema)
	})
	fmt.Printf("tenants: baseline active (load %s)\n", loadAverage())
	rep.Base.Active = tn.active(ctx, []tenantTarget{soloTarget})
	tn.stopRelay()

	// The fleet.
	fmt.Printf("tenants: fleet drain (load %s)\n", loadAverage())
	rep.Fleet.Drain = tn.drain(ctx, fleetBacklog, func() {
		tn.startRelay("relay-fleet", "run", "--targets", tn.files.fleet, "--db-conn-budget", strconv.Itoa(sc.Budget),
			"--dormant-after", sc.Dormant.String())
	})
	// The idle cost is the steady state's: the idle targets dormant.
	tn.sleep(ctx, sc.Warmup+sc.Dormant+10*time.Second)
	fmt.Printf("tenants: fleet idle (load %s)\n", loadAverage())
	rep.Idle = tn.idle(ctx)
	// A tenant added to the idle fleet: its backlog was written with the
	// others, while no relay served it; the clock starts as its line is
	// added to the list, and the list is re-read at once (SIGHUP).
	fmt.Printf("tenants: fleet drain, target added (load %s)\n", loadAverage())
	rep.Added = tn.drain(ctx, addedBacklog, func() {
		tn.writeTargets("fleet.txt", append(slices.Clone(tn.fleet), tn.added))
		require.NoError(t, tn.relay.Signal(syscall.SIGHUP))
	})
	fmt.Printf("tenants: fleet active (load %s)\n", loadAverage())
	rep.Fleet.Active = tn.active(ctx, tn.actives)
	tn.stopRelay()

	rep.LoadEnd = loadAverage()
	rep.Written, rep.Published = tn.m.totals()
	rep.Duplicates = tn.m.duplicateCount()
	rep.Checked = tn.checked.Load()
	if n := tn.m.missing(); n > 0 {
		// Not on Kafka is lost only when not in its outbox either: a relay
		// too slow to publish it leaves it there.
		waiting := tn.unpublished(ctx, append([]tenantTarget{soloTarget, tn.drained, tn.added}, tn.actives...))
		rep.Unpublished = waiting
		if int64(n) > waiting {
			rep.Lost = fmt.Sprintf("%d committed events never reached Kafka, and only %d rows are still in the outboxes", n, waiting)
		}
	}
	tn.mu.Lock()
	rep.Misrouted = slices.Clone(tn.misrouted)
	tn.mu.Unlock()
	return rep
}

// unpublished counts the rows left in the targets' outboxes (published
// rows are deleted).
func (tn *tenants) unpublished(ctx context.Context, targets []tenantTarget) int64 {
	var total int64
	for _, tg := range targets {
		conn, err := pgx.Connect(ctx, tn.pg.URL(tg.db))
		require.NoError(tn.t, err)
		var n int64
		err = conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{tg.schema, "pgbox_outbox"}.Sanitize()).Scan(&n)
		_ = conn.Close(ctx)
		require.NoError(tn.t, err)
		total += n
	}
	return total
}

// reserve takes n sequence numbers and returns the first.
func (tn *tenants) reserve(n int64) int64 { return tn.seq.Add(n) - n + 1 }

// tenantsKeys are the keys the backlogs spread over, with their slots.
func tenantsKeys() ([]string, []int32) {
	keys := make([]string, 1000)
	slots := make([]int32, len(keys))
	for i := range keys {
		keys[i] = "k-" + strconv.Itoa(i)
		slots[i] = int32(pressureSlot(keys[i]))
	}
	return keys, slots
}

func (tn *tenants) startRelay(instance string, args ...string) {
	httpPort, err := pgcluster.FreePort()
	require.NoError(tn.t, err)
	args = append(args, "--kafka-brokers", tn.addr, "--instance", instance, "--cleanup-interval", "0s",
		"--http-addr", "127.0.0.1:"+strconv.Itoa(httpPort))
	tn.relay = &harness.Proc{Name: instance, Path: tn.bin.Relay, LogPath: filepath.Join(tn.dir, instance+".log"), Args: args}
	tn.rep.httpAddr = "127.0.0.1:" + strconv.Itoa(httpPort)
	require.NoError(tn.t, tn.relay.Start())
}

func (tn *tenants) stopRelay() {
	require.NoError(tn.t, tn.relay.Term(30*time.Second), "stop %s", tn.relay.Name)
	tn.relay = nil
}

func (tn *tenants) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
		tn.t.Fatalf("tenants: %v", ctx.Err())
	case <-time.After(d):
	}
	if tn.relay != nil && !tn.relay.Running() {
		tn.t.Fatalf("tenants: %s exited: %v (log %s)", tn.relay.Name, tn.relay.ExitErr(), tn.relay.LogPath)
	}
}

// drainResult is one backlog drained by a relay started for it.
type drainResult struct {
	Rows    int
	Took    time.Duration // process start to the last record seen; 0: not drained within sc.Drain
	AllUp   time.Duration // fleet: process start to every target running (0: not seen)
	Arrived int           // when not drained within sc.Drain: how many arrived
	Load    string
	Started time.Time
}

// drain starts a relay and times it from the start until every event of b
// was seen by the consumer; it also notes when /metrics first reports
// every target of the list running.
func (tn *tenants) drain(ctx context.Context, b *burstRange, start func()) drainResult {
	r := drainResult{Rows: int(b.n), Load: loadAverage(), Started: time.Now()}
	start()
	deadline := r.Started.Add(tn.sc.Drain)
	for time.Now().Before(deadline) {
		if r.AllUp == 0 && strings.Contains(tn.relay.Name, "fleet") {
			if running, ok := tn.metric(`pgbox_relay_targets{state="running"}`); ok && int(running) == len(tn.fleet) {
				r.AllUp = time.Since(r.Started)
			}
		}
		if seen, last := tn.m.burstProgress(b); seen == b.n {
			r.Took = last.Sub(r.Started)
			break
		}
		tn.sleep(ctx, 50*time.Millisecond)
	}
	if r.Took == 0 {
		seen, _ := tn.m.burstProgress(b)
		// Slow is not wrong: the end of the run tells lost events from
		// events still waiting in an outbox.
		r.Arrived = int(seen)
		fmt.Printf("tenants: %s: backlog of %d rows not drained within %v: %d arrived\n", tn.relay.Name, b.n, tn.sc.Drain, seen)
	}
	return r
}

// activeResult is one active phase: writers at sc.Rate over some targets.
type activeResult struct {
	Targets       int
	Written       int64 // committed in the measured window
	Rate          float64
	P50, P99, Max time.Duration
	// SentP50, SentP99: commit → the record's timestamp (set by the relay
	// when it builds the record batch), the relay's share of the latency.
	SentP50, SentP99 time.Duration
	WriteErrs        int64
	Late             int // events of the phase not on Kafka sc.Drain after the writers stopped
	Load             string
	Proc             procSample    // the relay, at the end of the window
	CPU              float64       // the relay's CPU over the window, in cores
	Busy             float64       // the machine's CPUs busy over the window (every process), 0-1
	For              time.Duration // the measured window
	Top              []stmtCalls   // the statements that took the server most time in the window (writers' included)
}

// active runs writers at sc.Rate over targets (each transaction picks one
// at random, sets its search_path and writes one event with Notify), for
// sc.Warmup then sc.ActiveFor, stops them and waits until every event
// arrived; the figures cover the events committed in the measured window.
func (tn *tenants) active(ctx context.Context, targets []tenantTarget) activeResult {
	t, sc := tn.t, tn.sc
	ow, err := outbox.NewWriter(outbox.Config{Notify: true})
	require.NoError(t, err)
	first := tn.seq.Load() + 1
	w := startWritersFunc(ctx, t, tn.pg.URL(tenantsDB), sc.Rate, &tn.seq, tn.m, func(ctx context.Context, tx pgx.Tx, seq int64) (string, error) {
		tg := targets[rand.IntN(len(targets))]
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{tg.schema}.Sanitize()); err != nil {
			return "", err
		}
		key := "k-" + strconv.Itoa(rand.IntN(1000))
		return key, ow.Write(ctx, tx, outbox.Message{Topic: tenantsTopic(tg.name), Key: []byte(key), Value: tenantValue(seq, tg.name)})
	})
	defer w.stop()
	tn.sleep(ctx, sc.Warmup)
	r := activeResult{Targets: len(targets), Load: loadAverage()}
	st0 := tn.statements(ctx)
	from, cpu0, seq0 := time.Now(), tn.cpuTicks(), tn.seq.Load()
	busy0, all0 := machineTicks(t)
	tn.sleep(ctx, sc.ActiveFor)
	to, cpu1, seq1 := time.Now(), tn.cpuTicks(), tn.seq.Load()
	busy1, all1 := machineTicks(t)
	r.Busy = float64(busy1-busy0) / float64(max(all1-all0, 1))
	r.For = to.Sub(from)
	r.Top, _ = topStatements(st0, tn.statements(ctx), 20, true)
	r.Proc = tn.procSample()
	r.CPU = float64(cpu1-cpu0) / clockTicks / to.Sub(from).Seconds()
	w.stop()
	r.WriteErrs = w.errs.Load()
	// This phase's events only: the other backlog waits for its relay.
	last := tn.seq.Load()
	deadline := time.Now().Add(sc.Drain)
	for tn.m.missingIn(first, last) > 0 && time.Now().Before(deadline) {
		tn.sleep(ctx, 20*time.Millisecond)
	}
	if n := tn.m.missingIn(first, last); n > 0 {
		r.Late = n
		fmt.Printf("tenants: %s: %d events not on Kafka %v after the writers stopped\n", tn.relay.Name, n, sc.Drain)
	}
	var lat, sent []time.Duration
	for _, s := range tn.m.samples() {
		if !s.commit.Before(from) && s.commit.Before(to) {
			lat, sent = append(lat, s.latency), append(sent, s.sent)
		}
	}
	slices.Sort(lat)
	slices.Sort(sent)
	r.Written = int64(len(lat))
	// Transactions begun in the window (the writers number each one), not
	// only those whose event arrived.
	r.Rate = float64(seq1-seq0) / to.Sub(from).Seconds()
	if len(lat) > 0 {
		r.P50, r.P99, r.Max = quantile(lat, 0.50), quantile(lat, 0.99), lat[len(lat)-1]
		r.SentP50, r.SentP99 = quantile(sent, 0.50), quantile(sent, 0.99)
	}
	return r
}

// idleResult is the fleet's cost with every target idle.
type idleResult struct {
	For       time.Duration
	Xacts     int64 // transactions in the scenario's databases
	Calls     int64 // pg_stat_statements calls there (-1: not available)
	Conns     int   // pgbox-relay connections at the end
	ConnsByDB int   // the most of them in one database
	CPUTicks  int64
	Proc      procSample
	Load      string
	Targets   int
	Running   int // targets the relay reports running
	Dormant   int // targets whose relay is dormant at the end (read from their instance tables)
	Top       []stmtCalls
	Evicted   int64 // pg_stat_statements entries deallocated during the window (the calls are then a lower bound)
}

// stmtCalls is a statement's calls (summed over the targets' copies: the
// same text in every schema).
type stmtCalls struct {
	Query string
	Calls int64
	Exec  time.Duration // the server's execution time (total_exec_time)
	Plan  time.Duration // its planning time (total_plan_time)
}

type stmtSnapshot struct {
	calls   map[string]int64 // by userid/dbid/queryid
	exec    map[string]float64
	plan    map[string]float64
	query   map[string]string
	dealloc int64
}

// statements reads pg_stat_statements in the scenario's databases.
func (tn *tenants) statements(ctx context.Context) stmtSnapshot {
	s := stmtSnapshot{calls: map[string]int64{}, exec: map[string]float64{}, plan: map[string]float64{}, query: map[string]string{}}
	if !tn.rep.Statements {
		return s
	}
	rows, err := tn.stats.Query(ctx, `SELECT s.userid || '/' || s.dbid || '/' || s.queryid, s.calls, s.total_exec_time, s.total_plan_time, regexp_replace(left(s.query, 200), '\s+', ' ', 'g')
		FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1)`, tn.dbs)
	require.NoError(tn.t, err)
	for rows.Next() {
		var id, q string
		var c int64
		var ms, plan float64
		require.NoError(tn.t, rows.Scan(&id, &c, &ms, &plan, &q))
		s.calls[id], s.exec[id], s.plan[id], s.query[id] = c, ms, plan, q
	}
	require.NoError(tn.t, rows.Err())
	_ = tn.stats.QueryRow(ctx, `SELECT dealloc FROM pg_stat_statements_info`).Scan(&s.dealloc)
	return s
}

// topStatements are the n statements called most between two snapshots
// (byTime: that took the server's most execution time).
func topStatements(a, b stmtSnapshot, n int, byTime bool) ([]stmtCalls, int64) {
	by := map[string]*stmtCalls{}
	for id, c := range b.calls {
		if d := c - a.calls[id]; d > 0 {
			q := b.query[id]
			if by[q] == nil {
				by[q] = &stmtCalls{Query: q}
			}
			by[q].Calls += d
			by[q].Exec += time.Duration((b.exec[id] - a.exec[id]) * float64(time.Millisecond))
			by[q].Plan += time.Duration((b.plan[id] - a.plan[id]) * float64(time.Millisecond))
		}
	}
	var out []stmtCalls
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(x, y stmtCalls) int {
		if byTime {
			return cmp.Compare(y.Exec, x.Exec)
		}
		return cmp.Compare(y.Calls, x.Calls)
	})
	return out[:min(n, len(out))], b.dealloc - a.dealloc
}

func (tn *tenants) idle(ctx context.Context) idleResult {
	r := idleResult{For: tn.sc.Idle, Targets: len(tn.fleet), Load: loadAverage(), Calls: -1}
	x0, c0 := tn.dbCounters(ctx)
	st0 := tn.statements(ctx)
	cpu0, from := tn.cpuTicks(), time.Now()
	tn.sleep(ctx, tn.sc.Idle)
	cpu1, to := tn.cpuTicks(), time.Now()
	x1, c1 := tn.dbCounters(ctx)
	st1 := tn.statements(ctx)
	r.Top, r.Evicted = topStatements(st0, st1, 8, false)
	r.For = to.Sub(from)
	r.Xacts, r.CPUTicks = x1-x0, cpu1-cpu0
	if c0 >= 0 && c1 >= 0 {
		r.Calls = c1 - c0
	}
	require.NoError(tn.t, tn.stats.QueryRow(ctx, `SELECT coalesce(sum(n), 0)::int, coalesce(max(n), 0)::int FROM (
		SELECT datname, count(*) AS n FROM pg_stat_activity WHERE application_name = 'pgbox-relay' AND datname = ANY($1) GROUP BY datname) a`,
		tn.dbs).Scan(&r.Conns, &r.ConnsByDB))
	r.Proc = tn.procSample()
	if n, ok := tn.metric(`pgbox_relay_targets{state="running"}`); ok {
		r.Running = int(n)
	}
	r.Dormant = tn.dormant(ctx)
	return r
}

// dormant counts the fleet's targets whose every live relay instance is
// dormant (inspect.Instance.Dormant: sleeping and not kafka_ready).
func (tn *tenants) dormant(ctx context.Context) int {
	byDB := map[string][]string{}
	for _, tg := range tn.fleet {
		byDB[tg.db] = append(byDB[tg.db], tg.schema)
	}
	total := 0
	for db, schemas := range byDB {
		q := make([]string, len(schemas))
		for i, s := range schemas {
			tbl := pgx.Identifier{s, "pgbox_relay_instances"}.Sanitize()
			q[i] = `SELECT (EXISTS (SELECT 1 FROM ` + tbl + ` WHERE expires_at > now() AND sleeping AND NOT kafka_ready)
				AND NOT EXISTS (SELECT 1 FROM ` + tbl + ` WHERE expires_at > now() AND kafka_ready))::int AS d`
		}
		conn, err := pgx.Connect(ctx, tn.pg.URL(db))
		require.NoError(tn.t, err)
		var n int
		err = conn.QueryRow(ctx, `SELECT coalesce(sum(d), 0)::int FROM (`+strings.Join(q, " UNION ALL ")+`) x`).Scan(&n)
		_ = conn.Close(ctx)
		require.NoError(tn.t, err, "counting dormant targets in %s", db)
		total += n
	}
	return total
}

// dbCounters reads the scenario's databases' transactions and, when
// pg_stat_statements is there, statement calls (-1 otherwise).
func (tn *tenants) dbCounters(ctx context.Context) (xacts, calls int64) {
	// A backend reports its counters at most once a second, and when idle
	// within seconds: wait for the last ones before reading.
	time.Sleep(1500 * time.Millisecond)
	require.NoError(tn.t, tn.stats.QueryRow(ctx, `SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1)`,
		tn.dbs).Scan(&xacts))
	calls = -1
	if tn.rep.Statements {
		require.NoError(tn.t, tn.stats.QueryRow(ctx, `SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1)`,
			tn.dbs).Scan(&calls))
	}
	return xacts, calls
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux platform Go runs on).
const clockTicks = 100

// cpuTicks is the relay's user plus system CPU time so far.
func (tn *tenants) cpuTicks() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", tn.relay.Pid()))
	require.NoError(tn.t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	require.Greater(tn.t, len(f), 13, "/proc/<pid>/stat: %s", s)
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	require.NoError(tn.t, err1)
	require.NoError(tn.t, err2)
	return ut + st
}

// machineTicks is the machine's CPU time so far, busy and in all, summed
// over its CPUs (/proc/stat's cpu line; idle and iowait are not busy).
func machineTicks(t *testing.T) (busy, all int64) {
	b, err := os.ReadFile("/proc/stat")
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	require.True(t, len(f) > 5 && f[0] == "cpu", "/proc/stat: %s", line)
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err, "/proc/stat: %s", line)
		if i >= 7 { // guest and guest_nice are counted in user and nice already
			break
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// procSample is the relay's memory: RSS from /proc, the Go heap from its
// /metrics.
type procSample struct {
	RSS        int64 // bytes
	Heap       int64 // go_memstats_heap_alloc_bytes (-1: not read)
	Sys        int64 // go_memstats_sys_bytes (-1: not read)
	Goroutines int64
}

func (tn *tenants) procSample() procSample {
	p := procSample{Heap: -1, Sys: -1, Goroutines: -1}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tn.relay.Pid()))
	require.NoError(tn.t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(tn.t, err, "VmRSS %q", v)
			p.RSS = kb << 10
		}
	}
	if v, ok := tn.metric("go_memstats_heap_alloc_bytes"); ok {
		p.Heap = int64(v)
	}
	if v, ok := tn.metric("go_memstats_sys_bytes"); ok {
		p.Sys = int64(v)
	}
	if v, ok := tn.metric("go_goroutines"); ok {
		p.Goroutines = int64(v)
	}
	return p
}

// metric reads one series of the relay's /metrics (name with its labels as
// the exposition prints them).
func (tn *tenants) metric(series string) (float64, bool) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + tn.rep.httpAddr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
