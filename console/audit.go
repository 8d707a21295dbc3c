package console

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// AuditRecord is one action in the audit trail (table pgbox_console_audit).
type AuditRecord struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Actor is who acted; for a failed login ("login"), the name the
	// request claimed, cut to 256 bytes: text its sender chose.
	Actor string `json:"actor"`
	Role  Role   `json:"role"`
	// Method is how the actor authenticated: "basic", "bearer", "proxy",
	// "none" ("" on records from before migration 00110).
	Method string `json:"method"`
	Action string `json:"action"`
	// Target is what was asked: the form's known fields (the filter, the
	// ids confirmed), as name="value" pairs in name order, each value cut
	// to 1 KiB; for a failed login, the source address, method and path.
	Target string `json:"target"`
	// RowIDs are the rows the action selected.
	RowIDs []int64 `json:"row_ids"`
	// Affected is how many rows it changed.
	Affected int64 `json:"affected"`
	// Result is "ok", "refused: …" or the error.
	Result string `json:"result"`
}

// ReadAudit returns the newest limit records of the audit trail, newest first.
func ReadAudit(ctx context.Context, db DB, limit int) ([]AuditRecord, error) {
	rows, err := db.Query(ctx, sqlAuditList, limit)
	if err != nil {
		return nil, fmt.Errorf("console: read audit trail: %w (run `relay migrate up` if pgbox_console_audit is missing)", err)
	}
	recs, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return nil, fmt.Errorf("console: read audit trail: %w", err)
	}
	return recs, nil
}

func readAuditOne(ctx context.Context, db DB, id int64) (*AuditRecord, error) {
	rows, err := db.Query(ctx, sqlAuditOne, id)
	if err != nil {
		return nil, fmt.Errorf("console: read audit record %d: %w", id, err)
	}
	rec, err := pgx.CollectExactlyOneRow(rows, scanAudit)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("console: read audit record %d: %w", id, err)
	}
	return &rec, nil
}

func scanAudit(r pgx.CollectableRow) (AuditRecord, error) {
	var a AuditRecord
	err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Role, &a.Method, &a.Action, &a.Target, &a.RowIDs, &a.Affected, &a.Result)
	return a, err
}

// audit is one action's record while it runs.
type audit struct {
	h      *Handler
	id     int64
	who    Identity
	action string
	target string
}

// startAudit records that who asks for action on target, before anything
// is done: an action whose record cannot be written does not run.
func (h *Handler) startAudit(ctx context.Context, who Identity, action, target string) (*audit, error) {
	target = h.auditTarget(target)
	a := &audit{h: h, who: who, action: action, target: target}
	if err := h.cfg.DB.QueryRow(ctx, sqlAuditStart, who.Name, string(who.Role), action, target, who.Method).Scan(&a.id); err != nil {
		h.cfg.Logger.ErrorContext(ctx, "console: cannot write the audit record; action not taken",
			"actor", who.Name, "action", action, "target", target, "err", err)
		return nil, fmt.Errorf("console: write audit record (run `relay migrate up` if pgbox_console_audit is missing): %w", err)
	}
	return a, nil
}

// finish completes the record and logs the action.
func (a *audit) finish(ctx context.Context, ids []int64, affected int64, actErr error) {
	result := "ok"
	var ref *refusal
	switch {
	case errors.As(actErr, &ref):
		result = "refused: " + ref.why
	case actErr != nil:
		result = "error: " + actErr.Error()
	}
	if ids == nil {
		ids = []int64{}
	}
	ctx = context.WithoutCancel(ctx)
	if _, err := a.h.cfg.DB.Exec(ctx, sqlAuditFinish, a.id, ids, affected, result); err != nil {
		a.h.cfg.Logger.ErrorContext(ctx, "console: cannot complete the audit record", "audit_id", a.id, "err", err)
	}
	log := a.h.cfg.Logger.InfoContext
	if actErr != nil {
		log = a.h.cfg.Logger.WarnContext
	}
	log(ctx, "console action", "audit_id", a.id, "actor", a.who.Name, "role", string(a.who.Role), "auth", a.who.Method,
		"action", a.action, "target", a.target, "rows", len(ids), "affected", affected, "result", result)
}

// refused records an action refused before it ran (wrong role, rows that
// changed since the confirmation, too many rows, a bad parameter) and a
// failed login ("login").
func (h *Handler) refused(ctx context.Context, who Identity, action, target, why string) int64 {
	target = h.auditTarget(target)
	h.cfg.Logger.WarnContext(ctx, "console action refused", "actor", who.Name, "role", string(who.Role),
		"auth", who.Method, "action", action, "target", target, "reason", why)
	if h.cfg.DB == nil { // a fleet console's own pages: no database of their own (logged above)
		return 0
	}
	var id int64
	if err := h.cfg.DB.QueryRow(context.WithoutCancel(ctx), sqlAuditStart, who.Name, string(who.Role), action, target, who.Method).Scan(&id); err != nil {
		h.cfg.Logger.ErrorContext(ctx, "console: cannot write the audit record", "err", err)
		return 0
	}
	if _, err := h.cfg.DB.Exec(context.WithoutCancel(ctx), sqlAuditFinish, id, []int64{}, 0, "refused: "+why); err != nil {
		h.cfg.Logger.ErrorContext(ctx, "console: cannot complete the audit record", "audit_id", id, "err", err)
	}
	return id
}

// targetFields are the form fields an audit target records: the filters
// of the parked and dead-letter pages, the confirmed ids and replay counts, the "replay
// again" switch. Any other field a request carries is left out, so a
// made-up field name can neither forge target text nor swell it.
var targetFields = []string{"again", "confirmed", "consumer", "error", "ids", "key", "replays", "topic"}

// targetValueMax bounds each value an audit target records; the rows an
// action touched are recorded in full beside it (row_ids).
const targetValueMax = 1024

// target is the one text an audit record gives what was asked: the form's
// known fields (targetFields), as name="value" pairs in name order, each
// value cut to targetValueMax bytes. With HidePayloads a typed key or error
// text is recorded as hidden (the audit page is every viewer's).
func (h *Handler) target(form url.Values) string {
	var b strings.Builder
	for _, k := range targetFields {
		for _, v := range form[k] {
			if v == "" {
				continue
			}
			if (k == "key" || k == "error") && h.cfg.HidePayloads {
				v = "(hidden)"
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(k + "=" + strconv.Quote(bounded(v, targetValueMax)))
		}
	}
	return b.String()
}

// auditTarget is target as a fleet console's target pages record it:
// fleet_target="name" first, so the record names the target whatever
// schema holds it.
func (h *Handler) auditTarget(target string) string {
	if h.fleetName == "" {
		return target
	}
	t := "fleet_target=" + strconv.Quote(h.fleetName)
	if target != "" {
		t += " " + target
	}
	return t
}

// bounded is s as the audit trail may keep text a request chose: at most
// max bytes (cut on a character boundary, saying how much was cut), with
// invalid UTF-8 and NUL bytes, which PostgreSQL's text cannot hold,
// replaced by U+FFFD.
func bounded(s string, max int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes more)", s[:cut], len(s)-cut)
}
