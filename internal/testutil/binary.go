package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// MainWithBinary is a TestMain for a package whose tests run its command as
// a real process: it builds the package in the current directory once, as
// name in a temporary directory (with -race when the tests have it, so the
// subprocesses are checked too), sets *bin to its path, runs the tests,
// removes the binary and exits with the tests' code.
func MainWithBinary(m *testing.M, name string, bin *string) {
	dir, err := os.MkdirTemp("", "pgbox-"+name+"-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = filepath.Join(dir, name)
	args := []string{"build", "-o", *bin}
	if Race {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build %s binary: %v\n", name, err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
