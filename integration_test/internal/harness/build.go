// Package harness runs pgbox's whole chain as real OS processes and breaks
// it: a private PostgreSQL cluster (internal/pgcluster), the embedded Kafka
// broker in its own process with a data dir, the orders service, relay
// processes (the real relay binary), the payments consumer group, and
// a driver that injects faults on a seeded schedule while events flow; the
// verifier then reads the business tables and the downstream topic.
//
// Tests in integration_test/ build a World, start its processes, and either
// run the fault schedule (Run) or their own scenario on top of World's parts.
package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// RelayPkg is the package of pgbox's one binary. It is the only place the
// harness names it (cmd/relay is being renamed to cmd/relay).
const RelayPkg = "./cmd/relay"

// ProcPkg is the package of the harness's own processes (broker, orders,
// payments).
const ProcPkg = "./integration_test/cmd/chaosproc"

// Binaries are the built executables.
type Binaries struct {
	Relay string // relay
	Proc  string // chaosproc
}

// Build compiles the relay binary and chaosproc from the working tree into
// dir (with the race detector when race is true).
func Build(ctx context.Context, dir string, race bool) (Binaries, error) {
	root, err := ModuleRoot()
	if err != nil {
		return Binaries{}, err
	}
	return buildFrom(ctx, root, dir, race)
}

// buildFrom compiles the relay binary and chaosproc of the module checked
// out at root into dir.
func buildFrom(ctx context.Context, root, dir string, race bool) (Binaries, error) {
	b := Binaries{Relay: filepath.Join(dir, "relay"), Proc: filepath.Join(dir, "chaosproc")}
	for pkg, out := range map[string]string{RelayPkg: b.Relay, ProcPkg: b.Proc} {
		args := []string{"build", "-o", out}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	}
	return b, nil
}

// ModuleRoot is the directory of pgbox's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the pgbox module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}
