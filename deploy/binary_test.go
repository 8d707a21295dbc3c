// Package deploy holds no code: its tests check deploy/'s Dockerfile and
// Kubernetes manifests against the relay binary, which they build with the
// Dockerfile's own build command (there is no container engine to build the
// image with).
package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// root is the repository's root, from this package's directory.
var root = filepath.Join("..")

// relayBin is the binary built by the Dockerfile's build command.
var relayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgbox-deploy-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "relay")
	if err := buildLikeDockerfile(relayBin); err != nil {
		fmt.Fprintf(os.Stderr, "build the relay as deploy/Dockerfile does: %v\n", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// buildLikeDockerfile runs the Dockerfile's `go build` command (its
// environment assignments, flags and package) from the repository's root,
// writing the binary to out instead of the image's path.
func buildLikeDockerfile(out string) error {
	df, err := parseDockerfile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		return err
	}
	gb, err := df.goBuild()
	if err != nil {
		return err
	}
	args := slices.Clone(gb.args)
	args[gb.outIndex] = out
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), gb.env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// flagInfo is one setting as `relay <command> --help` prints it.
type flagInfo struct {
	name, env, def string
	oneOf          []string // allowed values, when the help lists them
}

// commandHelp is what `relay <command> --help` says.
type commandHelp struct {
	text       string
	positional [][]string // each positional argument's allowed words; nil: any
	optional   []string   // flags the synopsis names as optional ([--dry-run])
	flags      map[string]*flagInfo
	envs       map[string]*flagInfo
}

var (
	helpMu    sync.Mutex
	helpCache = map[string]*commandHelp{}

	usageRE  = regexp.MustCompile(`(?m)^Usage: relay (\S+)(.*?) \[flags\]$`)
	flagRE   = regexp.MustCompile(`(?m)^\s+--(\S+)\s+(\S+)\s+default (\S+)\s+(.*)$`)
	oneOfRE  = regexp.MustCompile(`\(one of ([^)]*)\)\s*$`)
	quotedRE = regexp.MustCompile(`"([^"]*)"`)
)

// help runs `relay <command> --help` once and parses it.
func help(t *testing.T, command string) *commandHelp {
	t.Helper()
	helpMu.Lock()
	defer helpMu.Unlock()
	if h, ok := helpCache[command]; ok {
		return h
	}
	cmd := exec.Command(relayBin, command, "--help")
	cmd.Env = []string{}
	out, err := cmd.Output()
	require.NoError(t, err, "relay %s --help: is %q a command of the binary?", command, command)
	text := string(out)
	u := usageRE.FindStringSubmatch(text)
	require.NotNil(t, u, "relay %s --help has no usage line:\n%s", command, text)
	require.Equal(t, command, u[1])
	h := &commandHelp{text: text, flags: map[string]*flagInfo{}, envs: map[string]*flagInfo{}}
	for _, w := range strings.Fields(u[2]) {
		if strings.HasPrefix(w, "[--") {
			h.optional = append(h.optional, strings.Trim(w, "[]-"))
			continue
		}
		if strings.ContainsAny(w, "[]") { // [ID...]: free-form
			h.positional = append(h.positional, nil)
			continue
		}
		h.positional = append(h.positional, strings.Split(w, "|"))
	}
	for _, m := range flagRE.FindAllStringSubmatch(text, -1) {
		f := &flagInfo{name: m[1], env: m[2], def: strings.Trim(m[3], `"`)}
		if o := oneOfRE.FindStringSubmatch(m[4]); o != nil {
			for _, q := range quotedRE.FindAllStringSubmatch(o[1], -1) {
				f.oneOf = append(f.oneOf, q[1])
			}
		}
		h.flags[f.name] = f
		h.envs[f.env] = f
	}
	require.NotEmpty(t, h.flags, "relay %s --help lists no settings:\n%s", command, text)
	helpCache[command] = h
	return h
}

// checkValue says whether v is a value the setting f accepts, judged by the
// kind of its default (bool, int, duration) or its list of allowed values.
// The run test (TestManifestsRunAgainstTheBinary) has the binary itself
// validate them too.
func checkValue(f *flagInfo, v string) error {
	switch {
	case f.oneOf != nil:
		if !slices.Contains(f.oneOf, v) {
			return fmt.Errorf("%q is not one of %q", v, f.oneOf)
		}
	case f.def == "true" || f.def == "false":
		if _, err := strconv.ParseBool(v); err != nil {
			return fmt.Errorf("%q is not a bool", v)
		}
	case isInt(f.def):
		if !isInt(v) {
			return fmt.Errorf("%q is not an integer", v)
		}
	case isDuration(f.def):
		if !isDuration(v) {
			return fmt.Errorf("%q is not a duration", v)
		}
	}
	return nil
}

func isInt(s string) bool { _, err := strconv.Atoi(s); return err == nil }

func isDuration(s string) bool { _, err := time.ParseDuration(s); return err == nil }
