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
// marked. At the crash offset it stops the committing goroutine there for
// good, for the parent to kill the process.
type commitWatch struct {
	last    atomic.Int64 // the offset the handler ran for last
	crashAt int64
}

func (w *commitWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (w *commitWatch) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if w.crashAt >= 0 && d.Err == nil && d.CommandTag.String() == "COMMIT" && w.last.Load() == w.crashAt {
		fmt.Println("PGBOX crash-point")
		_ = os.Stdout.Sync()
		select {}
	}
}

// TestSuiteChildProcess is not a test of its own: it is the body of the
// consumer process that TestSuiteKilledAfterCommitBeforeOffset starts and
// kills. Without PGBOX_SUITE_CHILD it returns at once.
func TestSuiteChildProcess(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	crashAt, err := strconv.ParseInt(os.Getenv("PGBOX_SUITE_CRASH_AT"), 10, 64)
	require.NoError(t, err)
	watch := &commitWatch{crashAt: crashAt}
	watch.last.Store(-1)
	cfg, err := pgxpool.ParseConfig(os.Getenv("PGBOX_SUITE_DB"))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = watch
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	b := &bundle{Addrs: strings.Split(os.Getenv("PGBOX_SUITE_BROKERS"), ","), Topic: os.Getenv("PGBOX_SUITE_TOPIC")}
	fn := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		watch.last.Store(m.Offset)
		return effect(ctx, tx, m)
	}
	s := settings{pool: pool, ib: newInbox(t, inbox.ByOffset()), fn: fn, group: "svc", topicIDs: true, commitOffsets: true}
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

func startChild(t *testing.T, a adapter, b *bundle, crashAt int64) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		childEnv+"="+a.name,
		"PGBOX_SUITE_DB="+b.DB.URL,
		"PGBOX_SUITE_BROKERS="+strings.Join(b.Addrs, ","),
		"PGBOX_SUITE_TOPIC="+b.Topic,
		"PGBOX_SUITE_CRASH_AT="+strconv.FormatInt(crashAt, 10),
	)
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
func TestSuiteKilledAfterCommitBeforeOffset(t *testing.T) {
	t.Parallel()
	forEach(t, false, func(t *testing.T, a adapter) {
		b := setup(t, 1)
		const n, crashAt = 20, 12
		b.ProduceEvents(t, events("e", n)...)

		c1 := startChild(t, a, b, crashAt)
		c1.waitLine(t, 60*time.Second, func(s string) bool { return s == "crash-point" })
		c1.kill()

		// The window is real: the effect of offset 12 committed, its offset did not.
		rows, _ := b.Effects(t)
		require.Equal(t, crashAt+1, rows)
		require.EqualValues(t, crashAt, b.Committed(t, "svc", 0))

		c2 := startChild(t, a, b, -1)
		line := c2.waitLine(t, 60*time.Second, func(s string) bool {
			return strings.HasPrefix(s, fmt.Sprintf("stats processed=%d ", n-crashAt-1))
		})
		require.Equal(t, fmt.Sprintf("stats processed=%d duplicates=1", n-crashAt-1), line, "the redelivered message was a duplicate")
		testutil.Eventually(t, 30*time.Second, "offsets committed", func() bool { return b.Committed(t, "svc", 0) == n })
		c2.kill()
		requireExactlyOnce(t, b, n, 1)
		require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM effects WHERE "offset" = $1`, crashAt))
	})
}
