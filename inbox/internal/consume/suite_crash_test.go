package consume_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testutil"
)

// Child mode: the crash test re-executes this test binary with
// PGBOX_SUITE_CHILD naming an adapter; TestSuiteChildProcess then runs a
// consumer of that adapter and reports on stdout.
const childEnv = "PGBOX_SUITE_CHILD"

// commitWatch is a pgx tracer that sees each COMMIT succeed: the moment
// after a transaction committed in PostgreSQL and before its offset is
// marked. When the handler's last call covered the crash offset it stops the
// committing goroutine there for good, for the parent to kill the process.
type commitWatch struct {
	first, last atomic.Int64 // the offsets the handler ran for last: first and last of its batch
	crashAt     int64
}

func (w *commitWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (w *commitWatch) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if w.crashAt >= 0 && d.Err == nil && d.CommandTag.String() == "COMMIT" && w.first.Load() <= w.crashAt && w.crashAt <= w.last.Load() {
		fmt.Println("PGBOX crash-point")
		_ = os.Stdout.Sync()
		select {}
	}
}

// TestSuiteChildProcess is not a test of its own: it is the body of the
// consumer process that TestSuiteKilledAfterCommitBeforeOffset starts and
// kills (with PGBOX_SUITE_BATCH set, a batch handler's, in batches of
// 5). Without PGBOX_SUITE_CHILD it returns at once.
func TestSuiteChildProcess(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	crashAt, err := strconv.ParseInt(os.Getenv("PGBOX_SUITE_CRASH_AT"), 10, 64)
	require.NoError(t, err)
	watch := &commitWatch{crashAt: crashAt}
	watch.first.Store(-1)
	watch.last.Store(-1)
	cfg, err := pgxpool.ParseConfig(os.Getenv("PGBOX_SUITE_DB"))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = watch
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	b := &bundle{Addrs: strings.Split(os.Getenv("PGBOX_SUITE_BROKERS"), ","), Topic: os.Getenv("PGBOX_SUITE_TOPIC")}
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		watch.first.Store(m.Offset)
		watch.last.Store(m.Offset)
		return effect(ctx, tx, m)
	}
	s := settings{pool: pool, ib: newInbox(t, inbox.ByOffset()), fn: fn, group: "svc", topicIDs: true, commitOffsets: true}
	if os.Getenv("PGBOX_SUITE_BATCH") != "" {
		s.fn, s.batch, s.batchFn = nil, 5, func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
			watch.first.Store(ms[0].Offset)
			watch.last.Store(ms[len(ms)-1].Offset)
			return batchEffect(ctx, tx, ms)
		}
	}
	for _, a := range adapters(false) {
		if a.name != name {
			continue
		}
		m := a.start(t, b, s)
		for {
			st := m.stats()
			fmt.Printf("PGBOX stats processed=%d duplicates=%d\n", st.Processed, st.Duplicates)
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Fatalf("no adapter %q", name)
}

// child is a running consumer process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
}

func startChild(t *testing.T, a adapter, b *bundle, crashAt int64, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		childEnv+"="+a.name,
		"PGBOX_SUITE_DB="+b.DB.URL,
		"PGBOX_SUITE_BROKERS="+strings.Join(b.Addrs, ","),
		"PGBOX_SUITE_TOPIC="+b.Topic,
		"PGBOX_SUITE_CRASH_AT="+strconv.FormatInt(crashAt, 10),
	)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	c := &child{cmd: cmd, lines: make(chan string, 1024), stderr: &bytes.Buffer{}}
	cmd.Stderr = c.stderr
	require.NoError(t, cmd.Start())
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "PGBOX "); ok {
				select {
				case c.lines <- line:
				default: // stats lines nobody waits for
				}
			}
		}
	}()
	t.Cleanup(c.kill)
	return c
}

// kill sends SIGKILL and reaps the process.
func (c *child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// waitLine returns the first line for which match is true.
func (c *child) waitLine(t *testing.T, timeout time.Duration, match func(string) bool) string {
	t.Helper()
	deadline := time.After(timeout)
	last := ""
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before the expected line (last: %q); stderr:\n%s", last, c.stderr.String())
			}
			if match(line) {
				return line
			}
			last = line
		case <-deadline:
			t.Fatalf("no expected line from the child within %v (last: %q); stderr:\n%s", timeout, last, c.stderr.String())
		}
	}
}

// A consumer process is killed (SIGKILL) after its database commit and
// before its offset commit. Kafka redelivers the message to the restarted
// process, which finds it a duplicate: one business effect per message.
// With a batch handler, the whole batch committed is redelivered and is
// duplicates.
func TestSuiteKilledAfterCommitBeforeOffset(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		for _, batch := range []bool{false, true} {
			killedAfterCommit(t, a, batch)
		}
	})
}

func killedAfterCommit(t *testing.T, a adapter, batch bool) {
	b := setup(t, 1)
	const n, crashAt = 20, 12
	b.ProduceEvents(t, events("e", n)...)
	var env []string
	if batch {
		env = append(env, "PGBOX_SUITE_BATCH=1")
	}

	c1 := startChild(t, a, b, crashAt, env...)
	c1.waitLine(t, 60*time.Second, func(s string) bool { return s == "crash-point" })
	c1.kill()

	// The window is real: the effect of offset 12 (and of its batch)
	// committed, its offset did not.
	rows, _ := b.Effects(t)
	committed := b.Committed(t, "svc", 0)
	if batch {
		require.Greater(t, rows, crashAt)
		require.LessOrEqual(t, committed, int64(crashAt))
	} else {
		require.Equal(t, crashAt+1, rows)
		require.EqualValues(t, crashAt, committed)
	}

	c2 := startChild(t, a, b, -1, env...)
	line := c2.waitLine(t, 60*time.Second, func(s string) bool {
		return strings.HasPrefix(s, fmt.Sprintf("stats processed=%d ", n-rows))
	})
	require.Equal(t, fmt.Sprintf("stats processed=%d duplicates=%d", n-rows, int64(rows)-committed), line,
		"the redelivered messages were duplicates")
	testutil.Eventually(t, 30*time.Second, "offsets committed", func() bool { return b.Committed(t, "svc", 0) == n })
	c2.kill()
	requireExactlyOnce(t, b, n, 1)
	require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM effects WHERE "offset" = $1`, crashAt))
}
