package inboxsarama_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
)

// Child mode: the crash test re-executes this test binary with
// PGBOX_CG_CHILD set; TestConsumerChildProcess then runs a consumer and
// reports each commit on stdout.
const childEnv = "PGBOX_CG_CHILD"

// TestConsumerChildProcess is not a test of its own: it is the body of the
// consumer process that TestConsumerKilledAfterCommitBeforeOffset starts and
// kills. Without PGBOX_CG_CHILD it returns at once.
func TestConsumerChildProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return
	}
	ctx := context.Background()
	crashAt, err := strconv.ParseInt(os.Getenv("PGBOX_CG_CRASH_AT"), 10, 64)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, os.Getenv("PGBOX_CG_DB"))
	require.NoError(t, err)
	defer pool.Close()
	brokers := strings.Split(os.Getenv("PGBOX_CG_BROKERS"), ",")
	group, topic := os.Getenv("PGBOX_CG_GROUP"), os.Getenv("PGBOX_CG_TOPIC")

	client, err := sarama.NewClient(brokers, cgConfig())
	require.NoError(t, err)
	defer client.Close()
	ib := newTestInbox(t, group, inbox.ByOffset())
	h := mustHandler(t, pool, ib, effect, inboxsarama.Config{Client: client, CommitOffsets: true})
	var mu sync.Mutex
	inboxsarama.SetAfterCommitForTest(h, func(ms []inbox.Message) {
		mu.Lock()
		defer mu.Unlock()
		st := h.Stats()
		last := ms[len(ms)-1]
		fmt.Printf("PGBOX committed offset=%d processed=%d duplicates=%d\n", last.Offset, st.Processed, st.Duplicates)
		if last.Offset == crashAt {
			// The database commit is done, the offset is not marked: the
			// parent kills this process now.
			fmt.Println("PGBOX crash-point")
			_ = os.Stdout.Sync()
			select {}
		}
	})
	cg, err := sarama.NewConsumerGroupFromClient(group, client)
	require.NoError(t, err)
	for {
		if err := cg.Consume(ctx, []string{topic}, h); err != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// child is a running consumer process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
}

func startChild(t *testing.T, b *cgBundle, group string, crashAt int64) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestConsumerChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		"PGBOX_CG_DB="+b.DB.URL,
		"PGBOX_CG_BROKERS="+strings.Join(b.Addrs, ","),
		"PGBOX_CG_GROUP="+group,
		"PGBOX_CG_TOPIC="+b.Topic,
		"PGBOX_CG_CRASH_AT="+strconv.FormatInt(crashAt, 10),
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
				c.lines <- line
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
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before the expected line; stderr:\n%s", c.stderr.String())
			}
			if match(line) {
				return line
			}
		case <-deadline:
			t.Fatalf("no expected line from the child within %v; stderr:\n%s", timeout, c.stderr.String())
		}
	}
}

// A consumer process is killed (SIGKILL) after its database commit and before
// its offset mark. Kafka redelivers the message to the restarted process,
// which finds it a duplicate: one business effect per message.
func TestConsumerKilledAfterCommitBeforeOffset(t *testing.T) {
	t.Parallel()
	b := cgSetup(t, 1)
	const n, crashAt = 20, 12
	b.ProduceEvents(t, events("e", n)...)

	c1 := startChild(t, b, "svc", crashAt)
	c1.waitLine(t, 60*time.Second, func(s string) bool { return s == "crash-point" })
	c1.kill()

	// The window is real: the effect of offset 12 committed, its offset did not.
	rows, _ := b.Effects(t)
	require.Equal(t, crashAt+1, rows)
	require.EqualValues(t, crashAt, b.Committed(t, "svc", 0))

	c2 := startChild(t, b, "svc", -1)
	line := c2.waitLine(t, 60*time.Second, func(s string) bool {
		return strings.HasPrefix(s, fmt.Sprintf("committed offset=%d ", n-1))
	})
	c2.kill()
	require.Contains(t, line, "duplicates=1", "the redelivered message was a duplicate")
	require.Contains(t, line, fmt.Sprintf("processed=%d", n-crashAt-1))
	rows, distinct := b.Effects(t)
	require.Equal(t, n, rows)
	require.Equal(t, n, distinct)
	require.Equal(t, 1, b.Count(t, `SELECT count(*) FROM effects WHERE "offset" = $1`, crashAt))
}
