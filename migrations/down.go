package migrations

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
)

// ErrDataLoss is what errors.Is finds in the error of a [Down] that was
// refused because its step would drop a table holding rows (or columns of
// one), and [DownConfig].Yes was not set.
var ErrDataLoss = errors.New("rolling back would lose data")

// ErrRelayRunning is what errors.Is finds in the error of a [Down] that was
// refused because a relay instance is registered and its registration has not
// expired, and [DownConfig].Force was not set.
var ErrRelayRunning = errors.New("a relay is running")

// ErrNoSchema is what errors.Is finds when no schema of the connection's
// search_path exists, so there is nowhere to look for (or create) pgbox's
// tables.
var ErrNoSchema = errors.New("no schema of the search_path exists")

// ErrNothingToRollBack is returned by [Down] when no pgbox migration is
// applied. It wraps goose.ErrNoNextVersion, as goose's own Down returns.
var ErrNothingToRollBack = fmt.Errorf("no pgbox migration is applied: %w", goose.ErrNoNextVersion)

// DownConfig holds the confirmations [Down] needs before a step that loses
// data. The zero value confirms nothing: a step that would lose rows, or that
// would run under a live relay, is refused.
type DownConfig struct {
	// Yes confirms a step that drops a table holding rows, or columns of
	// one: the rows (unpublished outbox rows, inbox keys whose redeliveries
	// would then be processed again, dead letters) are lost. Defaults to
	// false: such a step is refused with [ErrDataLoss].
	Yes bool

	// Force rolls back while a relay instance is registered with an
	// unexpired lease (the relay would fail on the missing tables mid-work).
	// Defaults to false: the step is refused with [ErrRelayRunning].
	Force bool
}

// Loss is one table a down step drops, or drops columns of, while it holds
// rows.
type Loss struct {
	// Table is the table's name.
	Table string
	// What names its rows for an operator ("outbox rows", "inbox key").
	What string
	// Rows is how many rows the table held when the step was planned.
	Rows int64
	// Columns is true when the step drops columns of the table, not the
	// table: the rows stay, the data in those columns goes.
	Columns bool
}

func (l Loss) String() string {
	if l.Columns {
		return fmt.Sprintf("stored data of %d %s (columns of %s)", l.Rows, l.What, l.Table)
	}
	return fmt.Sprintf("%d %s (%s)", l.Rows, l.What, l.Table)
}

// DownPlan is what rolling back the newest applied migration would do, read
// from the database just before the step. Rows written after the plan was
// read are lost too: stop the writers first.
type DownPlan struct {
	// Version is the migration the step rolls back; 0 when none is applied.
	Version int64
	// Source is its file name, like "00002_outbox.sql".
	Source string
	// Losses are the tables the step drops (or drops columns of) that hold
	// rows; empty when the step loses nothing.
	Losses []Loss
	// LiveInstances are the relay instances registered with an unexpired
	// lease.
	LiveInstances []string
}

// LossText lists the losses in one phrase ("3 outbox rows (pgbox_outbox),
// 2 inbox keys (pgbox_inbox)"); empty when there are none.
func (p DownPlan) LossText() string {
	parts := make([]string, len(p.Losses))
	for i, l := range p.Losses {
		parts[i] = l.String()
	}
	return strings.Join(parts, ", ")
}

// what names each pgbox table's rows for an operator: one, many.
var what = map[string][2]string{
	"pgbox_inbox":             {"inbox key", "inbox keys"},
	"pgbox_inbox_watermark":   {"inbox watermark", "inbox watermarks"},
	"pgbox_outbox":            {"outbox row", "outbox rows"},
	"pgbox_consumer_dead":     {"dead letter", "dead letters"},
	"pgbox_consumer_attempts": {"consumer attempt count", "consumer attempt counts"},
	"pgbox_relay_instances":   {"relay instance", "relay instances"},
	"pgbox_relay_lanes":       {"relay lane", "relay lanes"},
	"pgbox_cleanup_lease":     {"cleanup lease", "cleanup leases"},
}

const instancesTable = "pgbox_relay_instances"

// Down rolls back the newest applied migration, one version, as goose's
// Down does; call it again for the next. Before the step it reads a
// [DownPlan] and refuses, changing nothing, when a relay instance is live
// (unless cfg.Force: [ErrRelayRunning]) or when the step would drop a table
// holding rows or columns of one (unless cfg.Yes: [ErrDataLoss]). It returns
// the plan it checked, refused or not. With nothing applied it returns
// [ErrNothingToRollBack] and creates nothing, not even goose's version table.
func Down(ctx context.Context, db *sql.DB, cfg DownConfig) (DownPlan, error) {
	p, err := NewProvider(db, Config{})
	if err != nil {
		return DownPlan{}, err
	}
	plan, err := planDown(ctx, db, p)
	if err != nil {
		return plan, err
	}
	if plan.Version == 0 {
		return plan, fmt.Errorf("migrations: down: %w", ErrNothingToRollBack)
	}
	if len(plan.LiveInstances) > 0 && !cfg.Force {
		return plan, fmt.Errorf("migrations: down %s refused: %w: instance(s) %s registered with an unexpired lease (stop them first, or set DownConfig.Force)",
			plan.Source, ErrRelayRunning, strings.Join(plan.LiveInstances, ", "))
	}
	if len(plan.Losses) > 0 && !cfg.Yes {
		return plan, fmt.Errorf("migrations: down %s refused: %w: it would drop %s (set DownConfig.Yes to confirm)",
			plan.Source, ErrDataLoss, plan.LossText())
	}
	if _, err := p.Down(ctx); err != nil {
		return plan, fmt.Errorf("migrations: down %s: %w", plan.Source, err)
	}
	return plan, nil
}

// PlanDown reads what [Down] would do now, changing nothing.
func PlanDown(ctx context.Context, db *sql.DB) (DownPlan, error) {
	p, err := NewProvider(db, Config{})
	if err != nil {
		return DownPlan{}, err
	}
	return planDown(ctx, db, p)
}

func planDown(ctx context.Context, db *sql.DB, p *goose.Provider) (DownPlan, error) {
	schema, err := currentSchema(ctx, db)
	if err != nil {
		return DownPlan{}, err
	}
	var plan DownPlan
	if ok, err := tableExists(ctx, db, schema, TableName); err != nil || !ok {
		return plan, err // never migrated: nothing to roll back
	}
	if plan.Version, err = p.GetDBVersion(ctx); err != nil {
		return plan, fmt.Errorf("migrations: version: %w", err)
	}
	if plan.Version == 0 {
		return plan, nil
	}
	for _, s := range p.ListSources() {
		if s.Version == plan.Version {
			plan.Source = s.Path
		}
	}
	if plan.Source == "" {
		return plan, fmt.Errorf("migrations: the database is at version %d, which this pgbox does not ship: roll it back with the pgbox that applied it", plan.Version)
	}
	if plan.LiveInstances, err = liveInstances(ctx, db, schema); err != nil {
		return plan, err
	}
	plan.Losses, err = losses(ctx, db, schema, plan.Source)
	return plan, err
}

// currentSchema returns the schema pgbox's tables live in, or ErrNoSchema
// naming the search_path when none of its schemas exists.
func currentSchema(ctx context.Context, db *sql.DB) (string, error) {
	var schema sql.NullString
	var path string
	if err := db.QueryRowContext(ctx, currentSchemaSQL).Scan(&schema, &path); err != nil {
		return "", fmt.Errorf("migrations: current schema: %w", err)
	}
	if !schema.Valid {
		return "", fmt.Errorf("migrations: %w (search_path is %s): create the schema (CREATE SCHEMA …) or connect with an existing one", ErrNoSchema, path)
	}
	return schema.String, nil
}

func tableExists(ctx context.Context, db *sql.DB, schema, table string) (bool, error) {
	var ok bool
	if err := db.QueryRowContext(ctx, tableExistsSQL, schema, table).Scan(&ok); err != nil {
		return false, fmt.Errorf("migrations: look up table %s: %w", table, err)
	}
	return ok, nil
}

func liveInstances(ctx context.Context, db *sql.DB, schema string) ([]string, error) {
	if ok, err := tableExists(ctx, db, schema, instancesTable); err != nil || !ok {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, fmt.Sprintf(liveInstancesSQL, pgx.Identifier{schema, instancesTable}.Sanitize()))
	if err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", instancesTable, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", instancesTable, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", instancesTable, err)
	}
	return out, nil
}

// losses counts the rows of each table that source's down section drops, or
// drops columns of.
func losses(ctx context.Context, db *sql.DB, schema, source string) ([]Loss, error) {
	drops, err := downDrops(files, source)
	if err != nil {
		return nil, err
	}
	var out []Loss
	for _, d := range drops {
		ok, err := tableExists(ctx, db, schema, d.Table)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if err := db.QueryRowContext(ctx, fmt.Sprintf(countRowsSQL, pgx.Identifier{schema, d.Table}.Sanitize())).Scan(&d.Rows); err != nil {
			return nil, fmt.Errorf("migrations: count rows of %s: %w", d.Table, err)
		}
		if d.Rows > 0 {
			d.What = rowNoun(d.Table, d.Rows)
			out = append(out, d)
		}
	}
	return out, nil
}

// rowNoun names n rows of table: "1 outbox row", "3 outbox rows".
func rowNoun(table string, n int64) string {
	w, ok := what[table]
	if !ok {
		w = [2]string{"row", "rows"}
	}
	if n == 1 {
		return w[0]
	}
	return w[1]
}

var (
	dropTableRE  = regexp.MustCompile(`(?is)\bDROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
	dropColumnRE = regexp.MustCompile(`(?is)\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\s+DROP\s+COLUMN\b`)
)

// downDrops reads the tables a migration file's "+goose Down" section drops
// (or drops columns of), in the order it names them, with no row counts.
func downDrops(fsys fs.FS, source string) ([]Loss, error) {
	f, err := fsys.Open(source)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	defer f.Close()
	var down strings.Builder
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "-- +goose ") {
			in = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-- +goose ")) == "Down"
			continue
		}
		if in && !strings.HasPrefix(strings.TrimSpace(line), "--") {
			down.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read %s: %w", source, err)
	}
	var out []Loss
	add := func(table string, columns bool) {
		out = append(out, Loss{Table: table, Columns: columns})
	}
	for _, m := range dropTableRE.FindAllStringSubmatch(down.String(), -1) {
		add(strings.ToLower(m[1]), false)
	}
	for _, m := range dropColumnRE.FindAllStringSubmatch(down.String(), -1) {
		add(strings.ToLower(m[1]), true)
	}
	return out, nil
}
