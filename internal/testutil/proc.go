package testutil

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Proc is a command started by StartProc: its log (stderr) is kept, and
// watched for the line where its HTTP server says which address it listens
// on.
type Proc struct {
	Cmd *exec.Cmd

	mu   sync.Mutex
	logs strings.Builder
	addr chan string
	done chan struct{}
	err  error
}

// StartProc starts cmd, set up by the caller (Path, Args, Env); its stderr
// is read here, and so is its stdout when cmd.Stdout is nil. listen's first
// submatch, on a log line, is the address the HTTP server listens on. The
// process is killed when the test ends if it still runs.
func StartProc(t testing.TB, cmd *exec.Cmd, listen *regexp.Regexp) *Proc {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	if cmd.Stdout == nil {
		cmd.Stdout = cmd.Stderr
	}
	require.NoError(t, cmd.Start())
	p := &Proc{Cmd: cmd, addr: make(chan string, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listen.FindStringSubmatch(line); m != nil {
				p.addr <- m[1]
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Output is the log so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// Done is closed when the process has exited (and its log is read).
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is cmd.Wait's error, once Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// HTTPAddr waits (up to a minute) for the process to log its HTTP server's
// address, and fails the test if it exits first.
func (p *Proc) HTTPAddr(t testing.TB) string {
	t.Helper()
	name := filepath.Base(p.Cmd.Path)
	select {
	case a := <-p.addr:
		return a
	case <-p.done:
		t.Fatalf("%s exited before listening: %v\n%s", name, p.err, p.Output())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not start listening\n%s", name, p.Output())
	}
	return ""
}

// Result is one finished run of a binary.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// CleanEnv is the test process's environment without any setting pgbox's
// binaries read (DATABASE_URL, KAFKA_BROKERS, PGBOX_*), so only what a test
// passes reaches them.
func CleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || k == "KAFKA_BROKERS" || strings.HasPrefix(k, "PGBOX_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// RunToEnd runs bin with args in CleanEnv plus env ("K=V") to its end, and
// returns its exit code and output. It fails the test if bin cannot start or
// has not finished within timeout.
func RunToEnd(t testing.TB, timeout time.Duration, bin string, env []string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(CleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %s %v: %v", filepath.Base(bin), args, err)
		}
		code = ee.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not finish within %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), args, timeout, &stdout, &stderr)
	}
	return Result{Code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}
