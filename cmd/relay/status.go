package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/relay"
)

// The status queries. They read pgbox's tables as the relay and the consumer
// adapter leave them; counting the outbox and inbox scans them, which is
// fine for an operator's command (and for a metrics scrape every few
// seconds on tables the relay and cleanup keep short).
const (
	// $1: the lane count to group by (the lane table's, else the setting's).
	statusBacklogSQL = `SELECT topic, (slot % $1)::int AS lane,
	count(*) FILTER (WHERE parked_at IS NULL)::bigint,
	count(*) FILTER (WHERE parked_at IS NOT NULL)::bigint,
	min(created_at) FILTER (WHERE parked_at IS NULL),
	now()
FROM pgbox_outbox GROUP BY 1, 2 ORDER BY 1, 2`

	statusLanesSQL = `SELECT lane, lanes, coalesce(owner, ''), expires_at > now(), epoch,
	CASE WHEN expires_at > now() THEN extract(epoch FROM expires_at - now()) ELSE 0 END::float8
FROM pgbox_relay_lanes ORDER BY lane`

	statusInstancesSQL = `SELECT instance, started_at, heartbeat_at, expires_at > now()
FROM pgbox_relay_instances ORDER BY instance`

	statusParkedSQL = `SELECT id, event_id::text, topic, attempts, coalesce(last_error, ''), parked_at
FROM pgbox_outbox WHERE parked_at IS NOT NULL ORDER BY parked_at DESC, id DESC LIMIT 10`

	statusInboxSQL = `SELECT consumer, topic, count(*)::bigint, min(GREATEST(received_at, record_at)), now()
FROM pgbox_inbox GROUP BY 1, 2 ORDER BY 1, 2`

	statusDeadSQL = `SELECT consumer, topic, count(*)::bigint FROM pgbox_consumer_dead GROUP BY 1, 2 ORDER BY 1, 2`
)

// statusReport is what `relay status` prints (and, with --json, its JSON).
type statusReport struct {
	Time      time.Time     `json:"time"`
	Lanes     int           `json:"lanes"`
	Backlog   []backlogRow  `json:"outbox_backlog"`
	Unsent    int64         `json:"outbox_unpublished"`
	Parked    int64         `json:"outbox_parked"`
	OldestAge *float64      `json:"outbox_oldest_unpublished_age_seconds"`
	LaneRows  []laneRow     `json:"lanes_owned"`
	Instances []instanceRow `json:"relay_instances"`
	ParkedTop []parkedRow   `json:"parked_rows"`
	Inbox     []inboxRow    `json:"inbox"`
	Dead      []deadRow     `json:"dead_letters,omitempty"`
	Cutoffs   string        `json:"cutoffs"` // where the inbox cutoffs came from, or why there are none
}

type backlogRow struct {
	Topic       string   `json:"topic"`
	Lane        int      `json:"lane"`
	Unpublished int64    `json:"unpublished"`
	Parked      int64    `json:"parked"`
	OldestAge   *float64 `json:"oldest_unpublished_age_seconds"`
}

type laneRow struct {
	Lane      int     `json:"lane"`
	Lanes     int     `json:"lanes"`
	Owner     string  `json:"owner"`
	Held      bool    `json:"held"`
	Epoch     int64   `json:"epoch"`
	ExpiresIn float64 `json:"expires_in_seconds"`
}

type instanceRow struct {
	Instance    string    `json:"instance"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
}

type parkedRow struct {
	ID        int64     `json:"id"`
	EventID   string    `json:"event_id"`
	Topic     string    `json:"topic"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	ParkedAt  time.Time `json:"parked_at"`
}

type inboxRow struct {
	Consumer  string   `json:"consumer"`
	Topic     string   `json:"topic"`
	Keys      int64    `json:"keys"`
	OldestAge float64  `json:"oldest_key_age_seconds"`
	Window    *float64 `json:"window_seconds,omitempty"` // keys older than this are pruned
	Margin    *float64 `json:"margin_seconds,omitempty"` // window − oldest age; negative: overdue
	Note      string   `json:"note,omitempty"`
}

type deadRow struct {
	Consumer string `json:"consumer"`
	Topic    string `json:"topic"`
	Count    int64  `json:"count"`
}

func seconds(d time.Duration) *float64 { s := d.Seconds(); return &s }

// collectStatus reads the status from the database. lanesSetting groups the
// backlog when the lane table is empty (no relay ever ran). Without full, only
// the outbox backlog and the lanes are read (what a metrics scrape needs; the
// inbox can be large).
func collectStatus(ctx context.Context, pool *pgxpool.Pool, lanesSetting int, full bool) (*statusReport, error) {
	rep := &statusReport{Time: time.Now().UTC()}
	rows, err := pool.Query(ctx, statusLanesSQL)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("read pgbox_relay_lanes: %w", err))
	}
	for rows.Next() {
		var l laneRow
		if err := rows.Scan(&l.Lane, &l.Lanes, &l.Owner, &l.Held, &l.Epoch, &l.ExpiresIn); err != nil {
			return nil, fmt.Errorf("read pgbox_relay_lanes: %w", err)
		}
		rep.LaneRows = append(rep.LaneRows, l)
		rep.Lanes = l.Lanes
	}
	if err := rows.Err(); err != nil {
		return nil, schemaHint(fmt.Errorf("read pgbox_relay_lanes: %w", err))
	}
	if rep.Lanes == 0 {
		rep.Lanes = max(lanesSetting, 1)
	}

	rows, err = pool.Query(ctx, statusBacklogSQL, rep.Lanes)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("read pgbox_outbox: %w", err))
	}
	var oldest time.Duration = -1
	for rows.Next() {
		var b backlogRow
		var minCreated *time.Time
		var now time.Time
		if err := rows.Scan(&b.Topic, &b.Lane, &b.Unpublished, &b.Parked, &minCreated, &now); err != nil {
			return nil, fmt.Errorf("read pgbox_outbox: %w", err)
		}
		if minCreated != nil {
			age := now.Sub(*minCreated)
			b.OldestAge = seconds(age)
			oldest = max(oldest, age)
		}
		rep.Unsent += b.Unpublished
		rep.Parked += b.Parked
		rep.Backlog = append(rep.Backlog, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pgbox_outbox: %w", err)
	}
	if oldest >= 0 {
		rep.OldestAge = seconds(oldest)
	}

	if !full {
		return rep, nil
	}
	rows, err = pool.Query(ctx, statusInstancesSQL)
	if err != nil {
		return nil, fmt.Errorf("read pgbox_relay_instances: %w", err)
	}
	rep.Instances, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (instanceRow, error) {
		var i instanceRow
		err := r.Scan(&i.Instance, &i.StartedAt, &i.HeartbeatAt, &i.Live)
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pgbox_relay_instances: %w", err)
	}

	rows, err = pool.Query(ctx, statusParkedSQL)
	if err != nil {
		return nil, fmt.Errorf("read parked rows: %w", err)
	}
	rep.ParkedTop, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (parkedRow, error) {
		var p parkedRow
		err := r.Scan(&p.ID, &p.EventID, &p.Topic, &p.Attempts, &p.LastError, &p.ParkedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read parked rows: %w", err)
	}

	rows, err = pool.Query(ctx, statusInboxSQL)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("read pgbox_inbox: %w", err))
	}
	rep.Inbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (inboxRow, error) {
		var i inboxRow
		var oldestAt, now time.Time
		err := r.Scan(&i.Consumer, &i.Topic, &i.Keys, &oldestAt, &now)
		i.OldestAge = now.Sub(oldestAt).Seconds()
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pgbox_inbox: %w", err)
	}

	rows, err = pool.Query(ctx, statusDeadSQL)
	if err == nil {
		rep.Dead, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadRow, error) {
			var d deadRow
			err := r.Scan(&d.Consumer, &d.Topic, &d.Count)
			return d, err
		})
	}
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // consumer adapter's table absent: fine
		return nil, fmt.Errorf("read pgbox_consumer_dead: %w", err)
	}
	return rep, nil
}

// schemaHint turns "relation does not exist" into advice.
func schemaHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w (the pgbox tables are missing from the search_path: run `relay migrate up`, or set --schema)", err)
	}
	return err
}

// addCutoffs compares each inbox topic's oldest key with the cleanup window,
// taken from a dry-run cleanup pass.
func (rep *statusReport) addCutoffs(cr cleanup.Report) {
	if cr.Locked {
		rep.Cutoffs = "unknown: a cleanup pass is running (its lock is held)"
		return
	}
	rep.Cutoffs = "from Kafka topic configs (retention.ms + segment.ms + buffer)"
	for i := range rep.Inbox {
		in := &rep.Inbox[i]
		tr, ok := cr.Topic(in.Topic)
		if !ok {
			continue
		}
		if tr.Skipped {
			in.Note = "never pruned: " + string(tr.Reason)
			continue
		}
		in.Window = seconds(tr.Window)
		in.Margin = seconds(tr.Window - time.Duration(in.OldestAge*float64(time.Second)))
		if *in.Margin < 0 {
			in.Note = "overdue: older than the window (cleanup not running?)"
		}
		if tr.Forced {
			in.Note = "forced window (" + string(tr.Reason) + ")"
		}
	}
}

func cmdStatus(ctx context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("status takes no arguments (got %q)", args)
	}
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := collectStatus(ctx, pool, relay.LanesDefault, true)
	if err != nil {
		return err
	}
	if len(a.opts.Kafka.Brokers) == 0 {
		rep.Cutoffs = "unknown: set KAFKA_BROKERS to compare inbox ages with each topic's retention window"
	} else if len(rep.Inbox) == 0 {
		rep.Cutoffs = "none needed: no keys"
	} else {
		kcfg, err := a.opts.Kafka.saramaConfig()
		if err != nil {
			return err
		}
		lk := &lazyKafka{brokers: a.opts.Kafka.Brokers, cfg: kcfg}
		defer lk.Close()
		{
			c, err := cleanup.New(a.cleanupConfig(pool, lk, true))
			if err != nil {
				return err
			}
			cr, err := c.RunOnce(ctx)
			if err != nil {
				rep.Cutoffs = "unknown: " + err.Error()
			} else {
				rep.addCutoffs(cr)
			}
		}
	}
	if a.opts.JSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.print(a.stdout)
	return nil
}

func ageText(s *float64) string {
	if s == nil {
		return "-"
	}
	return durText(time.Duration(*s * float64(time.Second)))
}

func (rep *statusReport) print(w io.Writer) {
	fmt.Fprintf(w, "pgbox status at %s\n", rep.Time.Format(time.RFC3339))
	fmt.Fprintf(w, "\nOUTBOX: %d unpublished, %d parked, oldest unpublished %s (lanes: %d)\n", rep.Unsent, rep.Parked, ageText(rep.OldestAge), rep.Lanes)
	if len(rep.Backlog) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tLANE\tUNPUBLISHED\tPARKED\tOLDEST")
		for _, b := range rep.Backlog {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", b.Topic, b.Lane, b.Unpublished, b.Parked, ageText(b.OldestAge))
		}
		_ = tw.Flush()
	}
	if len(rep.ParkedTop) > 0 {
		fmt.Fprintln(w, "\nPARKED ROWS (newest 10; fix the cause, then UPDATE pgbox_outbox SET parked_at = NULL, attempts = 0 WHERE id = … to retry):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tEVENT ID\tTOPIC\tATTEMPTS\tPARKED AT\tLAST ERROR")
		for _, p := range rep.ParkedTop {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.EventID, p.Topic, p.Attempts, p.ParkedAt.UTC().Format(time.RFC3339), truncate(p.LastError, 80))
		}
		_ = tw.Flush()
	}

	held := map[string]int{}
	free := 0
	for _, l := range rep.LaneRows {
		if l.Held {
			held[l.Owner]++
		} else {
			free++
		}
	}
	fmt.Fprintf(w, "\nRELAY INSTANCES (%d lanes, %d unowned):\n", len(rep.LaneRows), free)
	if len(rep.Instances) == 0 {
		fmt.Fprintln(w, "  none running (an instance removes itself when it stops)")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "INSTANCE\tSTATE\tLANES HELD\tSTARTED\tLAST HEARTBEAT")
		for _, i := range rep.Instances {
			state := "live"
			if !i.Live {
				state = "expired"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s ago\n", i.Instance, state, held[i.Instance], i.StartedAt.UTC().Format(time.RFC3339),
				durText(rep.Time.Sub(i.HeartbeatAt)))
		}
		_ = tw.Flush()
	}
	if len(rep.LaneRows) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "LANE\tOWNER\tEPOCH\tLEASE LEFT")
		for _, l := range rep.LaneRows {
			owner := l.Owner
			if !l.Held {
				owner = "(free)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", l.Lane, owner, l.Epoch, durText(time.Duration(l.ExpiresIn*float64(time.Second))))
		}
		_ = tw.Flush()
	}

	fmt.Fprintf(w, "\nINBOX (cutoffs %s):\n", rep.Cutoffs)
	if len(rep.Inbox) == 0 {
		fmt.Fprintln(w, "  no keys")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tTOPIC\tKEYS\tOLDEST KEY AGE\tWINDOW\tMARGIN\tNOTE")
		for _, i := range rep.Inbox {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", i.Consumer, i.Topic, i.Keys, ageText(&i.OldestAge), ageText(i.Window), ageText(i.Margin), i.Note)
		}
		_ = tw.Flush()
	}
	if len(rep.Dead) > 0 {
		fmt.Fprintln(w, "\nDEAD LETTERS (consumer adapter):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tTOPIC\tCOUNT")
		for _, d := range rep.Dead {
			fmt.Fprintf(tw, "%s\t%s\t%d\n", d.Consumer, d.Topic, d.Count)
		}
		_ = tw.Flush()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
