package inspect

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/internal/durtext"
)

// The bounds past which a held horizon is worth an operator's attention:
// the console warns past them, `relay status` marks them, and
// docs/alerts.yml fires on the same figures (internal/doccheck checks it).
const (
	// HorizonWarnAge is how long a holder with a known start (a session's
	// open transaction, a prepared transaction) may hold the horizon. At
	// 1,000 writer transactions/s, ten minutes leaves about 600,000 deleted
	// outbox rows that no VACUUM may remove, and every claim walks them.
	HorizonWarnAge = 10 * time.Minute
	// HorizonWarnTransactions is the bound for holders without a start time
	// (a replication slot, a replica's hot_standby_feedback, a session whose
	// times this role may not see): transactions since the horizon it holds
	// (age(xid)), about 16 minutes at 1,000 transactions/s.
	HorizonWarnTransactions = 1_000_000
)

// HolderKind says what holds back the xmin horizon.
type HolderKind string

// The holders PostgreSQL counts when it decides what VACUUM may remove from
// pgbox's tables.
const (
	// HolderSession is a backend of this database with a snapshot
	// (backend_xmin: a REPEATABLE READ transaction that has read, a running
	// statement, pg_dump, a cursor) or a transaction id (backend_xid: a
	// transaction that wrote, idle in transaction or not).
	HolderSession HolderKind = "session"
	// HolderOtherDatabase is a backend of another database of the cluster
	// that holds a transaction id: every snapshot taken in this database
	// counts it as running, so VACUUM here keeps what it might still see.
	// (Its read-only snapshots hold back only that database and the shared
	// catalogs, and are not listed.)
	HolderOtherDatabase HolderKind = "other_database"
	// HolderReplica is a physical WAL sender whose standby runs with
	// hot_standby_feedback and no replication slot: the standby's oldest
	// query holds the whole cluster.
	HolderReplica HolderKind = "replica"
	// HolderSlot is a replication slot's xmin: a physical slot whose standby
	// sends hot_standby_feedback (or sent it and went away: the slot keeps
	// the last value until it is dropped). It holds the whole cluster.
	HolderSlot HolderKind = "replication_slot"
	// HolderSlotCatalog is a logical replication slot's catalog_xmin: it
	// holds back only the system catalogs, not pgbox's tables, and is listed
	// because catalog bloat slows every query's planning.
	HolderSlotCatalog HolderKind = "replication_slot_catalog"
	// HolderPrepared is a prepared transaction (PREPARE TRANSACTION) of any
	// database, waiting for COMMIT PREPARED or ROLLBACK PREPARED: its
	// transaction id is running for every snapshot of the cluster.
	HolderPrepared HolderKind = "prepared_xact"
)

// HoldsTables reports whether a holder of this kind keeps VACUUM from
// removing dead rows of pgbox's tables (every kind but HolderSlotCatalog).
func (k HolderKind) HoldsTables() bool { return k != HolderSlotCatalog }

// Horizon is what holds back VACUUM in the snapshot's database: the xmin
// horizon, the oldest transaction whose view of the data some holder may
// still need. Rows deleted after it (every row the relay publishes, every
// inbox key cleanup prunes) stay in the heap and the indexes until the
// holder lets go, and every claim walks them.
//
// PostgreSQL computes the horizon of a database's tables from the
// snapshots (backend_xmin) and transaction ids (backend_xid) of the
// backends of that database, plus, from the whole cluster: replication
// slots' xmin, WAL senders carrying hot_standby_feedback, prepared
// transactions, and the transaction ids of other databases' backends
// (every snapshot taken here counts them as running). A read-only snapshot
// in another database holds only that database and the shared catalogs.
// Horizon lists exactly those holders (VACUUM's own backends, which
// PostgreSQL ignores, and the reading backend itself are left out), read in
// one query over pg_stat_activity, pg_stat_replication,
// pg_replication_slots, pg_stat_progress_vacuum and pg_prepared_xacts:
// shared-memory views, cheap whatever the tables hold.
//
// It works for any role: without superuser or pg_read_all_stats, other
// roles' sessions show their pid, database, user, application and held
// xid, but PostgreSQL hides their state, times and query (Hidden is set and
// their age is in transactions only).
type Horizon struct {
	// AgeSeconds is how long the oldest holder of pgbox's tables with a
	// known start has held: the longest-open transaction of a session (an
	// upper bound: a READ COMMITTED transaction takes a new snapshot per
	// statement) or prepared transaction, in seconds from Snapshot.Time. nil
	// when no such holder exists.
	AgeSeconds *float64 `json:"age_seconds"`
	// AgeTransactions is age(xid) of the oldest horizon any holder of
	// pgbox's tables holds: transactions started since. It covers holders
	// without a time (slots, replicas, hidden sessions), and the rows a hold
	// leaves behind grow with it. 0 when nothing holds.
	AgeTransactions int64 `json:"age_transactions"`
	// Kinds gives, per kind of holder present, how many there are and the
	// oldest's ages; what package pgboxprom exports.
	Kinds []HorizonKind `json:"kinds"`
	// Holders lists the holders, the oldest horizon (largest
	// AgeTransactions) first, at most Config.HorizonList of them.
	Holders []HorizonHolder `json:"holders"`
	// More counts the holders left off Holders.
	More int `json:"more_holders,omitempty"`
}

// HorizonKind sums the holders of one kind.
type HorizonKind struct {
	Kind    HolderKind `json:"kind"`
	Holders int        `json:"holders"`
	// AgeSeconds is the oldest start among them (nil when none has a time);
	// AgeTransactions the oldest horizon.
	AgeSeconds      *float64 `json:"age_seconds"`
	AgeTransactions int64    `json:"age_transactions"`
}

// HorizonHolder is one session, replica, slot or prepared transaction that
// holds back the horizon.
type HorizonHolder struct {
	Kind HolderKind `json:"kind"`
	// PID is the backend's process id (for a slot: the WAL sender using it);
	// 0 when there is none (an unused slot, a prepared transaction).
	// pg_terminate_backend(PID) ends a session's hold.
	PID int `json:"pid,omitempty"`
	// Database is the session's, slot's or prepared transaction's database
	// ("" for a physical WAL sender or slot).
	Database string `json:"database,omitempty"`
	// User is the session's role, or the prepared transaction's owner.
	User        string `json:"user,omitempty"`
	Application string `json:"application_name,omitempty"`
	ClientAddr  string `json:"client_addr,omitempty"`
	// State is pg_stat_activity.state: "idle in transaction", "active"...
	State      string     `json:"state,omitempty"`
	XactStart  *time.Time `json:"xact_start,omitempty"`
	QueryStart *time.Time `json:"query_start,omitempty"`
	// Query is the session's current or last statement.
	Query string `json:"query,omitempty"`
	// Name is the slot's name or the prepared transaction's gid.
	Name string `json:"name,omitempty"`
	// Xmin is the transaction id it holds the horizon at, and
	// AgeTransactions its age(xid).
	Xmin            uint32 `json:"xmin"`
	AgeTransactions int64  `json:"age_transactions"`
	// AgeSeconds is how long its transaction has been open (a session: since
	// xact_start; a prepared transaction: since PREPARE); nil for slots,
	// replicas and hidden sessions.
	AgeSeconds *float64 `json:"age_seconds"`
	// Hidden is set for another role's session when this role lacks
	// pg_read_all_stats: PostgreSQL hides its state, times and query.
	Hidden bool `json:"hidden,omitempty"`
}

// Over reports whether the horizon is held past HorizonWarnAge or
// HorizonWarnTransactions.
func (h Horizon) Over() bool {
	return (h.AgeSeconds != nil && *h.AgeSeconds > HorizonWarnAge.Seconds()) || h.AgeTransactions > HorizonWarnTransactions
}

// Oldest returns the holder of pgbox's tables with the oldest horizon
// among those listed; ok is false when none is.
func (h Horizon) Oldest() (HorizonHolder, bool) {
	for _, x := range h.Holders {
		if x.Kind.HoldsTables() {
			return x, true
		}
	}
	return HorizonHolder{}, false
}

// sqlHorizon lists every holder of the current database's xmin horizon
// (see Horizon), oldest horizon first. Sessions of this database count
// with the older of their snapshot and transaction id (a snapshot's xmin
// is never newer than the backend's own xid); other databases' sessions
// with their transaction id only. Logical WAL senders (a database set) hold
// through their slot's catalog_xmin, listed from pg_replication_slots.
// backend_type is NULL exactly where PostgreSQL hides another role's
// session. Ages run from now(), the snapshot's Time, and never below zero
// (greatest ignores NULLs: an unknown start stays NULL through the CASE).
const sqlHorizon = `
WITH s AS (
	SELECT a.pid, a.datname, a.usename, a.application_name, host(a.client_addr) AS client_addr,
		a.state, a.xact_start, a.query_start, a.query, a.backend_type IS NULL AS hidden,
		CASE WHEN a.datname IS NOT DISTINCT FROM current_database() OR r.pid IS NOT NULL
			THEN coalesce(a.backend_xmin, a.backend_xid) ELSE a.backend_xid END AS held,
		CASE WHEN r.pid IS NOT NULL THEN CASE WHEN a.datname IS NULL THEN 'replica' END
			WHEN a.datname = current_database() THEN 'session'
			WHEN a.backend_xid IS NOT NULL THEN 'other_database' END AS kind
	FROM pg_stat_activity a LEFT JOIN pg_stat_replication r ON r.pid = a.pid
	WHERE a.pid <> pg_backend_pid()
	  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
	  AND a.pid NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum v)
), h AS (
	SELECT kind, pid, datname, usename, application_name, client_addr, state, xact_start, query_start,
		CASE WHEN hidden THEN NULL ELSE query END AS query, NULL::text AS name, held, xact_start AS since, hidden
	FROM s WHERE kind IS NOT NULL
	UNION ALL
	SELECT 'replication_slot', active_pid, database, NULL, NULL, NULL, NULL, NULL, NULL, NULL, slot_name::text, xmin, NULL, false
	FROM pg_replication_slots WHERE xmin IS NOT NULL
	UNION ALL
	SELECT 'replication_slot_catalog', active_pid, database, NULL, NULL, NULL, NULL, NULL, NULL, NULL, slot_name::text, catalog_xmin, NULL, false
	FROM pg_replication_slots WHERE catalog_xmin IS NOT NULL
	UNION ALL
	SELECT 'prepared_xact', NULL, database, owner, NULL, NULL, NULL, NULL, NULL, NULL, gid, transaction, prepared, false
	FROM pg_prepared_xacts
)
SELECT kind, coalesce(pid, 0), coalesce(datname, ''), coalesce(usename, ''), coalesce(application_name, ''),
	coalesce(client_addr, ''), coalesce(state, ''), xact_start, query_start, coalesce(query, ''), coalesce(name, ''),
	held, greatest(age(held), 0)::bigint, (CASE WHEN since IS NOT NULL THEN greatest(extract(epoch FROM now() - since), 0) END)::float8, hidden
FROM h ORDER BY age(held) DESC, pid`

// readHorizon fills s.Horizon.
func (s *Snapshot) readHorizon(ctx context.Context, tx pgx.Tx, cfg Config) error {
	rows, err := tx.Query(ctx, sqlHorizon)
	if err != nil {
		return fmt.Errorf("inspect: read the xmin horizon (pg_stat_activity, pg_replication_slots, pg_prepared_xacts): %w", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HorizonHolder, error) {
		var h HorizonHolder
		err := r.Scan(&h.Kind, &h.PID, &h.Database, &h.User, &h.Application, &h.ClientAddr, &h.State,
			&h.XactStart, &h.QueryStart, &h.Query, &h.Name, &h.Xmin, &h.AgeTransactions, &h.AgeSeconds, &h.Hidden)
		return h, err
	})
	if err != nil {
		return fmt.Errorf("inspect: read the xmin horizon: %w", err)
	}
	s.Horizon = summarize(all, cfg.HorizonList)
	return nil
}

// summarize sums the holders per kind and keeps the first list of them.
func summarize(all []HorizonHolder, list int) Horizon {
	var h Horizon
	kinds := map[HolderKind]*HorizonKind{}
	for _, x := range all {
		k := kinds[x.Kind]
		if k == nil {
			k = &HorizonKind{Kind: x.Kind}
			kinds[x.Kind] = k
		}
		k.Holders++
		k.AgeTransactions = max(k.AgeTransactions, x.AgeTransactions)
		k.AgeSeconds = maxAge(k.AgeSeconds, x.AgeSeconds)
		if x.Kind.HoldsTables() {
			h.AgeTransactions = max(h.AgeTransactions, x.AgeTransactions)
			h.AgeSeconds = maxAge(h.AgeSeconds, x.AgeSeconds)
		}
	}
	for _, k := range kinds {
		h.Kinds = append(h.Kinds, *k)
	}
	slices.SortFunc(h.Kinds, func(a, b HorizonKind) int { return cmp.Compare(a.Kind, b.Kind) })
	h.Holders = all[:min(len(all), list)]
	h.More = len(all) - len(h.Holders)
	return h
}

func maxAge(a, b *float64) *float64 {
	if a == nil || (b != nil && *b > *a) {
		return b
	}
	return a
}

// who names a holder for people: "session pid 4242 (psql, idle in transaction)".
func (x HorizonHolder) who() string {
	var parts []string
	for _, p := range []string{x.Application, x.State, x.Name} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if x.Hidden {
		parts = append(parts, "another role's session: grant pg_read_all_stats to see more")
	}
	s := string(x.Kind)
	if x.PID != 0 {
		s += fmt.Sprintf(" pid %d", x.PID)
	}
	if x.Database != "" && x.Kind != HolderSession {
		s += " in database " + x.Database
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

// Summary is one line saying how long the horizon has been held and by
// whom, as `relay status` and the console print it.
func (h Horizon) Summary() string {
	x, ok := h.Oldest()
	if !ok {
		return "not held: no session, replica, slot or prepared transaction holds back VACUUM of pgbox's tables"
	}
	age := fmt.Sprintf("%d transactions", h.AgeTransactions)
	if h.AgeSeconds != nil {
		age = ageText(h.AgeSeconds) + ", " + age
	}
	s := fmt.Sprintf("held %s; oldest horizon: %s", age, x.who())
	if h.Over() {
		s += fmt.Sprintf(" - past the bound (%s or %d transactions): VACUUM cannot remove the rows deleted since; see docs/operations.md, \"A held xmin horizon\"",
			durtext.Short(HorizonWarnAge), HorizonWarnTransactions)
	}
	return s
}

// printHorizon is WriteText's section on the xmin horizon.
func printHorizon(w io.Writer, s *Snapshot) {
	h := s.Horizon
	fmt.Fprintf(w, "\nXMIN HORIZON: %s\n", h.Summary())
	if len(h.Holders) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tPID\tDATABASE\tUSER\tAPPLICATION\tSTATE\tXACT AGE\tXACTS\tNAME/QUERY")
	for _, x := range h.Holders {
		pid := "-"
		if x.PID != 0 {
			pid = fmt.Sprint(x.PID)
		}
		what := x.Name
		if what == "" {
			what = strings.Join(strings.Fields(x.Query), " ")
		}
		if x.Hidden {
			what = "(hidden: grant pg_read_all_stats)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", x.Kind, pid, dash(x.Database), dash(x.User), dash(x.Application),
			dash(x.State), ageText(x.AgeSeconds), x.AgeTransactions, truncate(what, 60))
	}
	_ = tw.Flush()
	if h.More > 0 {
		fmt.Fprintf(w, "  … and %d more (younger) holders\n", h.More)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
