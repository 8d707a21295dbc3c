package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgbox/pgbox/internal/testutil"
)

// relayBin is the binary built once for the whole package's tests.
var relayBin string

func TestMain(m *testing.M) { testutil.MainWithBinary(m, "relay", &relayBin) }

// result is one finished run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// cleanEnv is the test process's environment without any setting the binary
// reads, so only what a test passes reaches it.
func cleanEnv() []string {
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

// relayCmd prepares the binary with args and extra environment ("K=V").
func relayCmd(ctx context.Context, env []string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// runRelay runs the binary to completion (at most timeout).
func runRelay(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd, stdout, stderr := relayCmd(ctx, env, args...)
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run relay %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("relay %v did not finish within %v\nstdout:\n%s\nstderr:\n%s", args, timeout, stdout, stderr)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}
