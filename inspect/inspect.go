// Package inspect gives operators two things: typed snapshots of pgbox's
// state, which only read, and the operator actions on parked rows and dead
// letters, which write. The names say which: [Read], List… and Count… only
// read; [RetryParked], [DiscardParked] and [ReplayDead] change rows, and
// their docs say what they write.
//
// # Reading
//
// [Read] takes a snapshot: the outbox backlog per topic and lane, parked
// rows, relay lanes and instances, inbox keys and each consumer's oldest key
// per topic against the topic's cleanup cutoff, dead letters, and who holds
// back the database's xmin horizon ([Horizon]). It is what
// `relay status` prints and what package pgboxprom exports as metrics; a
// service reads the same snapshot by calling Read.
//
// Reading costs about the same whatever the tables hold: every query follows
// an index or stops at a limit ([Config].ExactLimit), so a snapshot stays a
// few milliseconds with millions of backlog rows or inbox keys. Counts past
// the limit are planner estimates (Estimated is set); ages are always exact.
// A snapshot never takes or waits on the cleanup lease and runs in one
// transaction (rolled back: it writes nothing), bounded by
// [Config].StatementTimeout. [ListParked], [CountParked] and [ListDead] read
// the rows the actions below select.
//
// # Writing: operating parked rows and dead letters
//
// The actions act on what a snapshot shows; `relay parked` and `relay dead`
// call them. All are safe while relays and consumers run and idempotent (a
// second run leaves the same end state):
//
//   - [RetryParked] writes: it unparks the rows a [ParkedFilter] selects
//     (attempts restart at 0, last_error stays): running relays publish them
//     again; they keep their ids, so one key's rows go out in id order.
//     [DiscardParked] writes: it deletes them. Both work in short batches by
//     id, each statement re-checking that its rows are still parked, so a row
//     a relay or another operator changed meanwhile is left alone.
//   - [ReplayDead] writes, in one transaction: each dead letter's record (key,
//     value and headers as consumed; stored by the adapter since migration
//     00040) goes through outbox.Write to its source topic or a chosen one,
//     with the header inbox.ReplayHeader ("pgbox-replay-of: <id>"), and the
//     dead letter is marked replayed (replayed_at, replayed_to). The inbox
//     appends the replay id to the key of such a message (package inbox,
//     "Replayed dead letters"), so the replay is processed once while a
//     rewind over the original record is still a duplicate. A dead letter
//     replayed before is skipped unless [ReplayConfig].Again asks for a new
//     replay (with a new replay id).
package inspect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/pgerr"
	"github.com/pgbox/pgbox/internal/slot"
)

// Defaults for Config fields left zero.
const (
	// ExactLimitDefault is how many rows a count reads before it becomes an estimate.
	ExactLimitDefault = 1000
	// StatementTimeoutDefault bounds every query of a snapshot.
	StatementTimeoutDefault = 2 * time.Second
	// ParkedListDefault is how many of the newest parked rows a snapshot lists.
	ParkedListDefault = 10
	// HorizonListDefault is how many holders of the xmin horizon a snapshot lists.
	HorizonListDefault = 10
)

// DB is what Read queries: a *pgxpool.Pool, *pgx.Conn or pgx.Tx satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config configures [Read]. The zero value reads with every default.
type Config struct {
	// Lanes groups the backlog by lane when no relay ever ran (the lane table
	// is empty); otherwise the lane table's count is used. Defaults to
	// relay.LanesDefault (16).
	Lanes int

	// ExactLimit is how many rows a count reads; a count that reaches it is
	// replaced by the planner's estimate and marked Estimated. Defaults to
	// [ExactLimitDefault] (1,000).
	ExactLimit int

	// StatementTimeout bounds each query of the snapshot (SET LOCAL
	// statement_timeout). Defaults to [StatementTimeoutDefault] (2s).
	StatementTimeout time.Duration

	// ParkedList is how many of the newest parked rows are listed. Defaults
	// to [ParkedListDefault] (10).
	ParkedList int

	// HeldScan is how many of the later rows of its slot each listed parked
	// row's Held count reads (as ParkedFilter.HeldScan). Defaults to
	// [HeldScanDefault] (200); -1 counts nothing.
	HeldScan int

	// HorizonList is how many holders of the xmin horizon are listed
	// (Snapshot.Horizon.Holders, oldest first); the ages and per-kind sums
	// count them all. Defaults to [HorizonListDefault] (10).
	HorizonList int

	// Horizon, when set, is taken as the snapshot's xmin horizon
	// (Snapshot.Horizon) instead of reading it again: the horizon is the
	// database's, not the schema's, so a caller that reads many schemas
	// of one database reads it once ([ReadHorizon]) and hands it to each.
	// Its ages are as of that read. Defaults to nil: each snapshot reads
	// it.
	Horizon *Horizon

	// Cutoffs, when set, compares each inbox topic's oldest key with the
	// topic's cleanup window: cleanup.Cutoffs reads the windows from Kafka
	// with this config (a cleaner's own: Config.CutoffsConfig). It never
	// takes the cleanup lease. Defaults to nil: no comparison,
	// Snapshot.Cutoffs says why.
	Cutoffs *cleanup.CutoffsConfig

	// Logger receives a line when the cutoffs cannot be read. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (o Config) withDefaults() Config {
	if o.Lanes == 0 {
		o.Lanes = slot.LanesDefault
	}
	if o.ExactLimit == 0 {
		o.ExactLimit = ExactLimitDefault
	}
	if o.StatementTimeout == 0 {
		o.StatementTimeout = StatementTimeoutDefault
	}
	if o.ParkedList == 0 {
		o.ParkedList = ParkedListDefault
	}
	if o.HorizonList == 0 {
		o.HorizonList = HorizonListDefault
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

func (o Config) validate(db DB) error {
	var errs []error
	if db == nil {
		errs = append(errs, errNilDB)
	}
	if o.Lanes < 0 || o.Lanes > slot.Count {
		errs = append(errs, fmt.Errorf("inspect: Lanes %d is out of range (use 1..%d, as the relays do; or zero for %d)", o.Lanes, slot.Count, slot.LanesDefault))
	}
	if o.ExactLimit < 0 {
		errs = append(errs, fmt.Errorf("inspect: ExactLimit %d is negative (use a positive count, or zero for %d)", o.ExactLimit, ExactLimitDefault))
	}
	if o.StatementTimeout < 0 {
		errs = append(errs, fmt.Errorf("inspect: StatementTimeout %v is negative (use a positive duration, or zero for %v)", o.StatementTimeout, StatementTimeoutDefault))
	}
	if o.ParkedList < 0 {
		errs = append(errs, fmt.Errorf("inspect: ParkedList %d is negative (use a positive count, or zero for %d)", o.ParkedList, ParkedListDefault))
	}
	if err := checkHeldScan(o.HeldScan); err != nil {
		errs = append(errs, err)
	}
	if o.HorizonList < 0 {
		errs = append(errs, fmt.Errorf("inspect: HorizonList %d is negative (use a positive count, or zero for %d)", o.HorizonList, HorizonListDefault))
	}
	return errors.Join(errs...)
}

var errNilDB = errors.New("inspect: nil database (pass a *pgxpool.Pool, *pgx.Conn or pgx.Tx)")

// ErrSchemaMissing is returned (wrapped) when the pgbox tables are not on
// the search_path.
var ErrSchemaMissing = errors.New("the pgbox tables are missing from the search_path: run `relay migrate up`, or set the schema")

// ErrNoConnection is returned (wrapped) when no transaction could be begun:
// the database could not be reached, as opposed to a query that failed or
// ran past its statement timeout.
var ErrNoConnection = errors.New("no database connection")

// Read takes one snapshot. It runs in a transaction of its own on db (a
// savepoint when db is a pgx.Tx), rolled back at the end, each query bounded by Config.StatementTimeout; ctx bounds the whole.
func Read(ctx context.Context, db DB, cfg Config) (*Snapshot, error) {
	if err := cfg.validate(db); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	snap, err := readTx(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Cutoffs != nil {
		snap.addCutoffs(ctx, *cfg.Cutoffs, cfg.Logger)
	} else {
		snap.Cutoffs = "unknown: no Kafka admin to read topic configs from"
	}
	snap.ReadSeconds = time.Since(start).Seconds()
	return snap, nil
}

// begin starts a snapshot's transaction on db (roll it back when done)
// with Config.StatementTimeout, and returns the database's clock.
func begin(ctx context.Context, db DB, cfg Config) (pgx.Tx, time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("inspect: begin: %w (%w)", err, ErrNoConnection)
	}
	timeout := fmt.Sprintf("%dms", max(cfg.StatementTimeout.Milliseconds(), 1))
	var now time.Time
	if err := tx.QueryRow(ctx, sqlStart, timeout).Scan(&now); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, time.Time{}, fmt.Errorf("inspect: set statement_timeout, read the database clock: %w", err)
	}
	return tx, now.UTC(), nil
}

func readTx(ctx context.Context, db DB, cfg Config) (*Snapshot, error) {
	tx, now, err := begin(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	snap := &Snapshot{Time: now}
	steps := []func(context.Context, pgx.Tx, Config) error{
		snap.readLanes, snap.readBacklog, snap.readLaneAges, snap.readParked, snap.readInbox, snap.readDead, snap.readHorizon,
	}
	if cfg.Horizon != nil {
		steps = steps[:len(steps)-1]
		snap.Horizon = *cfg.Horizon
		snap.Horizon.Kinds = slices.Clone(cfg.Horizon.Kinds)
		snap.Horizon.Holders = slices.Clone(cfg.Horizon.Holders)
	}
	for _, step := range steps {
		if err := step(ctx, tx, cfg); err != nil {
			return nil, schemaHint(err)
		}
	}
	return snap, nil
}

// ReadHorizon reads the current database's xmin horizon alone (what
// Read puts in Snapshot.Horizon), in a transaction of its own on db,
// rolled back at the end, bounded by Config.StatementTimeout; the
// HorizonList of cfg applies, the rest of it is not used. Config.Horizon
// hands it to the snapshots of the database's schemas.
func ReadHorizon(ctx context.Context, db DB, cfg Config) (Horizon, error) {
	if err := cfg.validate(db); err != nil {
		return Horizon{}, err
	}
	cfg = cfg.withDefaults()
	tx, now, err := begin(ctx, db, cfg)
	if err != nil {
		return Horizon{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	snap := Snapshot{Time: now}
	if err := snap.readHorizon(ctx, tx, cfg); err != nil {
		return Horizon{}, err
	}
	return snap.Horizon, nil
}

// schemaHint wraps ErrSchemaMissing into "relation does not exist".
func schemaHint(err error) error {
	if pgerr.IsUndefinedTable(err) {
		return fmt.Errorf("%w (%w)", err, ErrSchemaMissing)
	}
	return err
}

func (s *Snapshot) readLanes(ctx context.Context, tx pgx.Tx, cfg Config) error {
	rows, err := tx.Query(ctx, sqlLanes)
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_relay_lanes: %w", err)
	}
	s.Lanes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lane, error) {
		var l Lane
		err := r.Scan(&l.Lane, &l.Lanes, &l.Owner, &l.Held, &l.Epoch, &l.ExpiresIn)
		return l, err
	})
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_relay_lanes: %w", err)
	}
	s.LaneCount = cfg.Lanes
	if len(s.Lanes) > 0 {
		s.LaneCount = s.Lanes[0].Lanes
	}
	rows, err = tx.Query(ctx, sqlInstances)
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_relay_instances: %w", err)
	}
	s.Instances, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) {
		var i Instance
		err := r.Scan(&i.Instance, &i.StartedAt, &i.HeartbeatAt, &i.Live, &i.KafkaReady, &i.KafkaDownSince, &i.Sleeping)
		i.Dormant = i.Sleeping && !i.KafkaReady
		return i, err
	})
	if err != nil {
		return fmt.Errorf("inspect: read pgbox_relay_instances: %w", err)
	}
	return nil
}
