package deploy

import (
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	op, rest string
}

// stage is one FROM … [AS name] and what follows it.
type stage struct {
	from, name string
	body       []instruction
}

type dockerfile struct {
	args   map[string]string // ARG defaults, global and per stage
	stages []*stage
}

func parseDockerfile(path string) (*dockerfile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	df := &dockerfile{args: map[string]string{}}
	var cur *stage
	pending := ""
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if pending == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			pending += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		full := pending + trimmed
		pending = ""
		op, rest, _ := strings.Cut(full, " ")
		in := instruction{op: strings.ToUpper(op), rest: strings.TrimSpace(rest)}
		switch in.op {
		case "ARG":
			k, v, _ := strings.Cut(in.rest, "=")
			df.args[k] = v
		case "FROM":
			f := strings.Fields(in.rest)
			cur = &stage{from: df.expand(f[0])}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				cur.name = f[2]
			}
			df.stages = append(df.stages, cur)
			continue
		}
		if cur != nil {
			cur.body = append(cur.body, in)
		}
	}
	if len(df.stages) == 0 {
		return nil, errors.New("deploy/Dockerfile: no FROM")
	}
	return df, nil
}

var argRefRE = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

// expand substitutes ARG defaults, as a build without --build-arg would.
func (df *dockerfile) expand(s string) string {
	return argRefRE.ReplaceAllStringFunc(s, func(m string) string {
		return df.args[strings.Trim(m, "${}")]
	})
}

func (df *dockerfile) final() *stage { return df.stages[len(df.stages)-1] }

// goBuildCmd is the Dockerfile's `go build`: the environment it sets, its
// arguments (after `go`), and where the -o path is among them.
type goBuildCmd struct {
	stage    *stage
	env      []string
	args     []string
	outIndex int
	pkg      string
}

func (df *dockerfile) goBuild() (*goBuildCmd, error) {
	for _, s := range df.stages {
		for _, in := range s.body {
			if in.op != "RUN" || !strings.Contains(in.rest, "go build") {
				continue
			}
			words, err := shellWords(df.expand(in.rest))
			if err != nil {
				return nil, err
			}
			gb := &goBuildCmd{stage: s, outIndex: -1}
			i := 0
			for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
				gb.env = append(gb.env, words[i])
			}
			if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
				return nil, fmt.Errorf("deploy/Dockerfile: RUN %s: want [VAR=value...] go build …", in.rest)
			}
			gb.args = words[i+1:]
			for j, a := range gb.args {
				if a == "-o" && j+1 < len(gb.args) {
					gb.outIndex = j + 1
				}
			}
			if gb.outIndex < 0 {
				return nil, fmt.Errorf("deploy/Dockerfile: go build without -o")
			}
			gb.pkg = gb.args[len(gb.args)-1]
			return gb, nil
		}
	}
	return nil, errors.New("deploy/Dockerfile: no RUN … go build")
}

// shellWords splits a RUN line as sh would for the simple forms the
// Dockerfile uses: spaces, double quotes (anywhere in a word), no escapes.
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.ContainsRune("&|;`'\\", r) && !quoted:
			return nil, fmt.Errorf("deploy/Dockerfile: %q: keep the go build RUN line one simple command", s)
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("deploy/Dockerfile: unbalanced quote in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// imageUser is the final stage's USER (uid and gid as written).
func (df *dockerfile) imageUser() string {
	user := ""
	for _, in := range df.final().body {
		if in.op == "USER" {
			user = in.rest
		}
	}
	return user
}

// jsonForm reads an exec-form instruction (ENTRYPOINT ["/relay"]).
func jsonForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	require.NoError(t, json.Unmarshal([]byte(in.rest), &v), "deploy/Dockerfile: %s %s: use the exec (JSON) form", in.op, in.rest)
	return v
}

// TestDockerfile: the image is built in stages from ./cmd/relay, static
// (CGO_ENABLED=0, and the binary that command builds has no dynamic loader),
// with a Go at least as new as go.mod's; the final stage holds the binary the
// build stage wrote, runs it as a numeric non-root user, starts a command
// the binary has, and exposes the port of its default --http-addr.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	df, err := parseDockerfile(filepath.Join(root, "deploy", "Dockerfile"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(df.stages), 2, "a multi-stage build: the toolchain stays out of the image")

	gb, err := df.goBuild()
	require.NoError(t, err)
	require.NotSame(t, df.final(), gb.stage, "the binary is built in an earlier stage than the one shipped")
	require.Equal(t, "./cmd/relay", gb.pkg, "the image's binary is the relay")
	require.Contains(t, gb.env, "CGO_ENABLED=0", "a static binary: the final stage has no libc")
	requireGoAtLeastGoMod(t, gb.stage.from)

	f, err := elf.Open(relayBin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the relay the Dockerfile builds is dynamically linked")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "the relay the Dockerfile builds needs shared libraries")

	built := gb.args[gb.outIndex]
	var entry, cmdArgs []string
	shipped := ""
	for _, in := range df.final().body {
		switch in.op {
		case "COPY":
			f := strings.Fields(in.rest)
			if len(f) == 3 && f[0] == "--from="+gb.stage.name && f[1] == built {
				shipped = f[2]
			}
		case "ENTRYPOINT":
			entry = jsonForm(t, in)
		case "CMD":
			cmdArgs = jsonForm(t, in)
		case "EXPOSE":
			_, port, err := net.SplitHostPort(help(t, "run").flags["http-addr"].def)
			require.NoError(t, err)
			require.Equal(t, port, in.rest, "EXPOSE differs from the port of relay run's default --http-addr")
		}
	}
	require.NotEmpty(t, shipped, "the final stage copies %s from stage %q", built, gb.stage.name)
	require.Equal(t, []string{shipped}, entry, "ENTRYPOINT runs the binary the build stage made")
	require.NotEmpty(t, cmdArgs, "CMD names the default command")
	help(t, cmdArgs[0]) // fails unless the binary has that command

	uid, gid, _ := strings.Cut(df.imageUser(), ":")
	n, err := strconv.Atoi(uid)
	require.NoError(t, err, "USER %q: a numeric uid, so runAsNonRoot can verify it", df.imageUser())
	require.NotZero(t, n, "the image runs as root")
	if gid != "" {
		g, err := strconv.Atoi(gid)
		require.NoError(t, err)
		require.NotZero(t, g, "the image runs in group root")
	}
}

var goLineRE = regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`)

// requireGoAtLeastGoMod: the build image's Go (golang:1.26…) builds the
// module: it is not older than go.mod's go line.
func requireGoAtLeastGoMod(t *testing.T, from string) {
	t.Helper()
	m := regexp.MustCompile(`^golang:(\d+)\.(\d+)`).FindStringSubmatch(from)
	require.NotNil(t, m, "build stage FROM %q: the Go toolchain's image, golang:<version>", from)
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	g := goLineRE.FindSubmatch(b)
	require.NotNil(t, g, "go.mod has no go line")
	have := [2]int{atoi(t, m[1]), atoi(t, m[2])}
	want := [2]int{atoi(t, string(g[1])), atoi(t, string(g[2]))}
	require.True(t, have[0] > want[0] || have[0] == want[0] && have[1] >= want[1],
		"FROM %s is older than go.mod's go %d.%d", from, want[0], want[1])
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
