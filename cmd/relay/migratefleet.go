package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/migrations"
)

// `relay migrate up|status` over a target list: each target on a pool of
// its own (its schema as search_path), at most --migrate-concurrency at a
// time, every target's result in one table, a failure not stopping the
// others.

const (
	// fleetTargetConns is each target's pool: goose's locked connection,
	// the shared lock's, and one for the version reads.
	fleetTargetConns = 4

	// versionTableSQL and appliedSQL read goose's version table in the
	// first schema of the search_path without goose, whose Status takes
	// the migrations' lock (and would wait for a migrator). The table is
	// looked up by name and schema in pg_class's index on both: through
	// pg_tables (schemaname = current_schema()) it was found among every
	// schema's table of that name, 3 ms a read in a database of 1,000
	// targets, read for each of them every round of `relay run`'s reader.
	versionTableSQL = `SELECT EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = $1 AND c.relkind IN ('r', 'p')
	AND c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema()))`
	appliedSQL = `SELECT DISTINCT version_id FROM %s WHERE is_applied AND version_id > 0`

	schemaLockSQL   = `SELECT pg_advisory_xact_lock($1)`
	createSchemaSQL = `CREATE SCHEMA IF NOT EXISTS %s`

	// migrationLockSharedSQL takes the lock every single-target migrator
	// (migrations.Up, `relay migrate up`, goose with pgbox's table) holds
	// exclusively, shared: a target list's migrations run beside each
	// other, each under its schema's own lock (targetLockID), and never
	// beside a single-target migrator of the same database.
	migrationLockSharedSQL   = `SELECT pg_advisory_lock_shared($1)`
	migrationUnlockSharedSQL = `SELECT pg_advisory_unlock_shared($1)`
)

// migrateTargets runs `migrate up` or `migrate status` on every target of
// the list. down is refused: a step that may drop rows is one target's
// decision.
func migrateTargets(ctx context.Context, a *app, action string) error {
	src := a.opts.Targets.sourceSetting()
	if action == "down" {
		return usageError("migrate down is refused with %s, nothing rolled back: it rolls back one target at a time; run `relay migrate down` with --database-url and --schema of the target to roll back", src)
	}
	list, err := loadTargets(ctx, a)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintf(a.stdout, "no targets: %s lists none\n", src)
		return nil
	}
	work, header := migrateTargetUp, []string{"RESULT"}
	if action == "status" {
		work, header = targetStatus, []string{"VERSION", "STATE"}
	}
	results := forEachTarget(ctx, a, list, action, work)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "NAME\tSCHEMA\tDATABASE\t%s\n", strings.Join(header, "\t"))
	failed := 0
	for i, t := range list {
		cols := results[i].cols
		if err := results[i].err; err != nil {
			failed++
			cols = []string{"failed: " + oneLine(err.Error())}
			if action == "status" {
				cols = append([]string{"-"}, cols...)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.display(), t.Schema, dbconf.RedactDSN(t.DatabaseURL), strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed == 0 {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if action == "status" {
		return fmt.Errorf("migrate status: %d of %d targets could not be read (see the table)", failed, len(list))
	}
	return fmt.Errorf("migrate up: %d of %d targets failed (see the table); the others are migrated: run `relay migrate up` again to resume (targets already at version %s are left as they are)",
		failed, len(list), schemaVersion())
}

// targetResult is one target's columns of the table, or its failure.
type targetResult struct {
	cols []string
	err  error
}

// forEachTarget runs work on every target, at most --migrate-concurrency
// at a time, and returns the results in the list's order.
func forEachTarget(ctx context.Context, a *app, list []targetSpec, action string, work func(context.Context, targetSpec) ([]string, error)) []targetResult {
	results := make([]targetResult, len(list))
	sem := make(chan struct{}, max(a.opts.Targets.Concurrency, 1))
	var wg sync.WaitGroup
	for i, t := range list {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			results[i].err = ctx.Err()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			log := a.log.With("target", t.Name, "schema", t.Schema)
			level := slog.LevelInfo // up changes the target; status only reads it
			if action == "status" {
				level = slog.LevelDebug
			}
			log.Log(ctx, level, "migrate "+action+": target started", "database", dbconf.RedactDSN(t.DatabaseURL))
			cols, err := work(ctx, t)
			if err != nil {
				err = fmt.Errorf("%s", dbconf.RedactErr(err, t.DatabaseURL))
				log.Warn("migrate "+action+": target failed", "err", err)
			} else {
				log.Log(ctx, level, "migrate "+action+": target done", "result", strings.Join(cols, " "))
			}
			results[i] = targetResult{cols: cols, err: err}
		})
	}
	wg.Wait()
	return results
}

// openTarget opens a pool on the target's database with its schema as
// search_path.
func openTarget(ctx context.Context, t targetSpec, conns int) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(t.DatabaseURL, t.Schema, conns)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s: %w", dbconf.RedactDSN(t.DatabaseURL), err)
	}
	return dbconf.Open(ctx, cfg, t.DatabaseURL)
}

// migrateTargetUp applies the pending migrations to one target, creating
// its schema first if it does not exist.
func migrateTargetUp(ctx context.Context, t targetSpec) ([]string, error) {
	pool, err := openTarget(ctx, t, fleetTargetConns)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	created, err := ensureSchema(ctx, pool, t.Schema)
	if err != nil {
		return nil, err
	}
	unlock, err := lockMigrationsShared(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer unlock()
	before, err := appliedVersions(ctx, pool)
	if err != nil {
		return nil, err
	}
	db := sqlDB(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db, migrations.Config{LockID: targetLockID(t.Schema)})
	if err != nil {
		return nil, err
	}
	if _, err := p.Up(ctx); err != nil {
		return nil, fmt.Errorf("migrations: up: %w", err)
	}
	after, err := appliedVersions(ctx, pool)
	if err != nil {
		return nil, err
	}
	from, to := newest(before), newest(after)
	switch {
	case created:
		return []string{fmt.Sprintf("migrated to %d (schema created)", to)}, nil
	case len(after) == len(before):
		return []string{fmt.Sprintf("already at %d", to)}, nil
	}
	return []string{fmt.Sprintf("migrated to %d (from %d)", to, from)}, nil
}

// ensureSchema creates the schema unless it exists: looked up first (CREATE
// SCHEMA IF NOT EXISTS needs the CREATE right on the database even then),
// under the schema's migration lock held for the transaction (two
// processes creating it at once would otherwise collide).
func ensureSchema(ctx context.Context, pool *pgxpool.Pool, schema string) (created bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, schemaLockSQL, targetLockID(schema)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, schemaExistsSQL, schema).Scan(&exists); err != nil || exists {
			return err
		}
		created = true
		_, err := tx.Exec(ctx, fmt.Sprintf(createSchemaSQL, pgx.Identifier{schema}.Sanitize()))
		return err
	})
	if err != nil {
		return false, fmt.Errorf("create schema %q: %w", schema, err)
	}
	return created, nil
}

// lockMigrationsShared holds migrations.LockIDDefault shared on a
// connection of its own until unlock is called.
func lockMigrationsShared(ctx context.Context, pool *pgxpool.Pool) (unlock func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, migrationLockSharedSQL, migrations.LockIDDefault); err != nil {
		conn.Release()
		return nil, fmt.Errorf("wait for the migrations' lock: %w", err)
	}
	return func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), migrationUnlockSharedSQL, migrations.LockIDDefault); err != nil {
			_ = conn.Conn().Close(context.Background()) // closing the session releases it
		}
		conn.Release()
	}, nil
}

// targetLockID is the advisory lock key of one schema's migrations from a
// target list: two processes migrating the same target list wait for each
// other, schema by schema.
func targetLockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("pgbox:" + migrations.TableName + ":" + schema))
	return int64(h.Sum64() >> 1)
}

// appliedVersions reads the versions applied to the target's schema (none
// when the schema or goose's table does not exist); it takes no lock and
// writes nothing.
func appliedVersions(ctx context.Context, pool querier) ([]int64, error) {
	var hasTable bool
	if err := pool.QueryRow(ctx, versionTableSQL, migrations.TableName).Scan(&hasTable); err != nil {
		return nil, fmt.Errorf("read %s: %w", migrations.TableName, err)
	}
	if !hasTable {
		return nil, nil
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(appliedSQL, pgx.Identifier{migrations.TableName}.Sanitize()))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", migrations.TableName, err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", migrations.TableName, err)
	}
	slices.Sort(vs)
	return vs, nil
}

// querier is what appliedVersions reads through: a pool with the target's
// schema as its search_path, or a transaction that set it.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func newest(vs []int64) int64 {
	if len(vs) == 0 {
		return 0
	}
	return slices.Max(vs)
}

// shippedVersions are the versions of the migrations this binary ships.
func shippedVersions() []int64 {
	names, _ := fs.Glob(migrations.FS(), "*.sql")
	var vs []int64
	for _, n := range names {
		v, _, _ := strings.Cut(n, "_")
		if x, err := strconv.ParseInt(v, 10, 64); err == nil {
			vs = append(vs, x)
		}
	}
	slices.Sort(vs)
	return vs
}

// targetStatus compares one target's applied migrations with the binary's:
// behind (a migration this binary ships is not applied, as
// migrations.Check refuses), ahead (a newer one is applied: this binary
// works on it) or current. It writes nothing.
func targetStatus(ctx context.Context, t targetSpec) ([]string, error) {
	pool, err := openTarget(ctx, t, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, schemaExistsSQL, t.Schema).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up schema %q: %w", t.Schema, err)
	}
	if !exists {
		return []string{"-", "behind: no schema (`relay migrate up` with the target list creates it)"}, nil
	}
	applied, err := appliedVersions(ctx, pool)
	if err != nil {
		return nil, err
	}
	shipped := shippedVersions()
	pending := 0
	for _, v := range shipped {
		if !slices.Contains(applied, v) {
			pending++
		}
	}
	at, head := newest(applied), newest(shipped)
	switch {
	case pending > 0:
		return []string{strconv.FormatInt(at, 10), fmt.Sprintf("behind: %d of this relay's migrations pending (it ships %d)", pending, head)}, nil
	case at > head:
		return []string{strconv.FormatInt(at, 10), fmt.Sprintf("ahead: this relay ships %d and works on it", head)}, nil
	}
	return []string{strconv.FormatInt(at, 10), "current"}, nil
}

// oneLine joins an error's lines (pgx puts each address it tried on its own).
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
