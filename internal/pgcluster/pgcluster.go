// Package pgcluster runs a private, throwaway PostgreSQL cluster for tests that
// must stop, crash or restart the server (integration_test/): initdb into a
// temporary directory, a free loopback port, trust authentication for one
// superuser. It never touches the server DATABASE_URL names.
//
// The server binaries come from PGBOX_PG_BINDIR when set, else from
// pg_config --bindir, else from the newest /usr/lib/postgresql/*/bin, else
// from PATH (the search scripts/devdb.sh makes). When the process runs as
// root, the server runs as the postgres user (postgres refuses root) through
// runuser.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDirEnv names the environment variable that points at the directory
// holding initdb, pg_ctl and postgres.
const BinDirEnv = "PGBOX_PG_BINDIR"

// SuperUser is the cluster's superuser, authenticated by trust.
const SuperUser = "pgbox"

// StartTimeoutDefault is Config.StartTimeout's default.
const StartTimeoutDefault = 60 * time.Second

// Config configures Start.
type Config struct {
	// Dir is where the cluster's data directory and log go; it must not
	// hold a cluster yet. Defaults to a new directory under os.TempDir().
	Dir string
	// Settings are extra postgresql.conf lines ("fsync = off"). Defaults to
	// none beyond the package's own (loopback only, max_connections 300).
	Settings []string
	// StartTimeout bounds each start and restart. Defaults to
	// StartTimeoutDefault (60s).
	StartTimeout time.Duration
}

// Cluster is one running (or stopped) private PostgreSQL cluster.
type Cluster struct {
	// Dir holds data/ and postgres.log.
	Dir string
	// Port is the loopback port the server listens on.
	Port int
	// BinDir is where initdb and pg_ctl were found.
	BinDir string
	// Log is the server's log file.
	Log string

	data    string
	runAs   string // "" when the current user runs the server
	timeout time.Duration
}

// Start initdbs a new cluster, picks a free loopback port and starts the
// server. Call Destroy when done.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{BinDir: bin, timeout: cfg.StartTimeout}
	if c.timeout == 0 {
		c.timeout = StartTimeoutDefault
	}
	if c.runAs, err = serverUser(); err != nil {
		return nil, err
	}
	if c.Dir, err = c.makeDir(cfg.Dir); err != nil {
		return nil, err
	}
	c.data = filepath.Join(c.Dir, "data")
	c.Log = filepath.Join(c.Dir, "postgres.log")
	if err := c.initdb(ctx); err != nil {
		return nil, err
	}
	if c.Port, err = FreePort(); err != nil {
		return nil, err
	}
	if err := c.writeConf(cfg.Settings); err != nil {
		return nil, err
	}
	if err := c.ctl(ctx, "start", "-w", "-t", c.timeoutSecs(), "-l", c.Log); err != nil {
		return nil, err
	}
	return c, nil
}

// URL returns a connection URL for database db as the superuser.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", SuperUser, c.Port, db)
}

// CreateDatabase creates database name.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.Port, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgcluster: create database %s: %w", name, err)
	}
	return nil
}

// RestartImmediate is a crash and a restart: `pg_ctl restart -m immediate`
// (no checkpoint, every backend killed, crash recovery on start).
func (c *Cluster) RestartImmediate(ctx context.Context) error {
	return c.ctl(ctx, "restart", "-m", "immediate", "-w", "-t", c.timeoutSecs(), "-l", c.Log)
}

// Stop stops the server (fast mode); its data stays for Restart.
func (c *Cluster) Stop(ctx context.Context) error {
	return c.ctl(ctx, "stop", "-m", "fast", "-w", "-t", c.timeoutSecs())
}

// StartAgain starts a stopped server on the same port and data.
func (c *Cluster) StartAgain(ctx context.Context) error {
	return c.ctl(ctx, "start", "-w", "-t", c.timeoutSecs(), "-l", c.Log)
}

// Destroy stops the server (immediate mode) and deletes its directory unless
// keep is true (to look at the log of a failed run).
func (c *Cluster) Destroy(keep bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var err error
	if _, statErr := os.Stat(filepath.Join(c.data, "postmaster.pid")); statErr == nil {
		err = c.ctl(ctx, "stop", "-m", "immediate", "-w", "-t", c.timeoutSecs())
	}
	if !keep {
		err = errors.Join(err, os.RemoveAll(c.Dir))
	}
	return err
}

func (c *Cluster) timeoutSecs() string { return strconv.Itoa(int(c.timeout.Seconds())) }

func (c *Cluster) makeDir(dir string) (string, error) {
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "pgcluster-")
	} else {
		err = os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return "", fmt.Errorf("pgcluster: cluster directory: %w", err)
	}
	if c.runAs != "" {
		if err := chownTo(dir, c.runAs); err != nil {
			return "", err
		}
		// The server user must reach dir through its parents.
		if out, err := c.command(context.Background(), "test", "-x", dir).CombinedOutput(); err != nil {
			return "", fmt.Errorf("pgcluster: user %s cannot reach %s (a parent directory is not searchable): %v %s", c.runAs, dir, err, out)
		}
	}
	return dir, nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	args := []string{"-D", c.data, "-U", SuperUser, "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"}
	out, err := c.command(ctx, filepath.Join(c.BinDir, "initdb"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: initdb into %s: %w\n%s", c.data, err, out)
	}
	return nil
}

func (c *Cluster) writeConf(extra []string) error {
	lines := []string{
		"# pgcluster",
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(c.Port),
		"unix_socket_directories = ''",
		"max_connections = 300",
		"log_min_messages = warning",
	}
	lines = append(lines, extra...)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: postgresql.conf: %w", err)
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	return errors.Join(err, f.Close())
}

func (c *Cluster) ctl(ctx context.Context, args ...string) error {
	args = append([]string{"-D", c.data}, args...)
	out, err := c.command(ctx, filepath.Join(c.BinDir, "pg_ctl"), args...).CombinedOutput()
	if err != nil {
		tail, _ := os.ReadFile(c.Log)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		return fmt.Errorf("pgcluster: pg_ctl %s (port %d): %w\n%s\nlog tail:\n%s", args[2], c.Port, err, bytes.TrimSpace(out), tail)
	}
	return nil
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if c.runAs == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "runuser", append([]string{"-u", c.runAs, "--", name}, args...)...)
}

// serverUser is who runs the server: "" (ourselves) unless we are root.
func serverUser() (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return "", fmt.Errorf("pgcluster: running as root and there is no postgres user to run the server as (create one, or run as a non-root user): %w", err)
	}
	return "postgres", nil
}

func chownTo(dir, name string) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("pgcluster: user %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("pgcluster: chown %s to %s: %w", dir, name, err)
	}
	return nil
}

// FindBinDir returns the directory of initdb and pg_ctl: PGBOX_PG_BINDIR,
// pg_config --bindir, the newest /usr/lib/postgresql/*/bin, or PATH.
func FindBinDir() (string, error) {
	ok := func(d string) bool {
		for _, b := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(BinDirEnv); d != "" {
		if !ok(d) {
			return "", fmt.Errorf("pgcluster: %s=%s holds no initdb and pg_ctl", BinDirEnv, d)
		}
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); ok(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if d := filepath.Dir(p); ok(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("pgcluster: no PostgreSQL server binaries (initdb, pg_ctl) found: set %s, or install them (Debian: apt-get install postgresql)", BinDirEnv)
}

func majorOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// FreePort returns a loopback TCP port nobody listens on right now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
