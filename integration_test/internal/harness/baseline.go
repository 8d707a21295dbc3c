package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoBaseline is in BuildBaseline's error when the repository's history
// does not hold the baseline commit (a shallow clone).
var ErrNoBaseline = errors.New("the upgrade baseline commit is not in this clone's history")

// Baseline is the previous release, built from the repository's own history.
type Baseline struct {
	Commit string
	// Bin are its relay and chaosproc (its writer, consumer and broker).
	Bin Binaries
	// Schema is its newest migration's version: the schema its relay's
	// `migrate up` leaves.
	Schema int64

	root, src string
}

// baselineRE finds the baseline in CHANGELOG.md: "Upgrade baseline: `c23a897`".
var baselineRE = regexp.MustCompile("(?m)^Upgrade baseline: `([0-9a-f]{7,40})`")

// ChangelogBaseline returns the upgrade baseline commit the newest release of
// CHANGELOG.md (at the module's root) names.
func ChangelogBaseline() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		return "", err
	}
	m := baselineRE.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("CHANGELOG.md names no upgrade baseline (a line \"Upgrade baseline: `<commit>`\")")
	}
	return string(m[1]), nil
}

// BuildBaseline checks commit out of the repository's own history into a
// git worktree under dir (never into the working tree) and builds its relay
// and chaosproc there. Close removes the worktree.
func BuildBaseline(ctx context.Context, commit, dir string, race bool) (*Baseline, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: git cat-file -e %s^{commit}: %v %s(a shallow clone? `git fetch --unshallow`, or clone with the full history)",
			ErrNoBaseline, commit, err, out)
	}
	b := &Baseline{Commit: commit, root: root, src: filepath.Join(dir, "src")}
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "worktree", "add", "--detach", b.src, commit).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("git worktree add %s %s: %w\n%s", b.src, commit, err, out)
	}
	if b.Bin, err = buildFrom(ctx, b.src, filepath.Join(dir, "bin"), race); err != nil {
		b.Close()
		return nil, fmt.Errorf("build the baseline %s: %w", commit, err)
	}
	if b.Schema, err = NewestMigration(os.DirFS(filepath.Join(b.src, "migrations"))); err != nil {
		b.Close()
		return nil, fmt.Errorf("baseline %s: %w", commit, err)
	}
	return b, nil
}

// Close removes the baseline's worktree (its binaries stay in dir).
func (b *Baseline) Close() {
	_ = exec.Command("git", "-C", b.root, "worktree", "remove", "--force", b.src).Run()
	_ = exec.Command("git", "-C", b.root, "worktree", "prune").Run()
}

// NewestMigration is the highest version among the migration files
// ("00090_console_audit.sql") in fsys.
func NewestMigration(fsys fs.FS) (int64, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return 0, err
	}
	var versions []int64
	for _, e := range entries {
		v, _, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migration file %s: version %q: %w", e.Name(), v, err)
		}
		versions = append(versions, n)
	}
	if len(versions) == 0 {
		return 0, errors.New("no migration files")
	}
	return slices.Max(versions), nil
}

// SchemaVersion is the newest pgbox migration applied to database db.
func (w *World) SchemaVersion(ctx context.Context, db string) (int64, error) {
	conn, err := pgx.Connect(ctx, w.PG.URL(db))
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var v int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM pgbox_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version of %s: %w", db, err)
	}
	return v, nil
}

// WaitProgress waits until new business effects and new downstream records
// have appeared (or every order is handled), for at most limit, and says
// how long that took.
func (w *World) WaitProgress(ctx context.Context, limit time.Duration) (time.Duration, error) {
	m := newMonitor(w)
	defer m.close()
	return m.waitProgress(ctx, limit)
}
