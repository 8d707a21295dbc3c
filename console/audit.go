package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditRecord is one action in the audit trail (table pgbox_console_audit).
type AuditRecord struct {
	ID    int64     `json:"id"`
	At    time.Time `json:"at"`
	Actor string    `json:"actor"`
	Role  Role      `json:"role"`
	// Method is how the actor authenticated: "basic", "bearer", "proxy",
	// "none" ("" on records from before migration 00110).
	Method string `json:"method"`
	Action string `json:"action"`
	// Target is what was asked: the form's fields (the filter, or the ids
	// confirmed), as name="value" pairs in name order.
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
	h.cfg.Logger.WarnContext(ctx, "console action refused", "actor", who.Name, "role", string(who.Role),
		"auth", who.Method, "action", action, "target", target, "reason", why)
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

// target is the one text an audit record gives what was asked: the form's
// fields but the token, as name="value" pairs in name order. With
// HidePayloads a typed key or error text is recorded as hidden (the audit
// page is every viewer's).
func (h *Handler) target(form url.Values) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(form)) {
		for _, v := range form[k] {
			if v == "" || k == "csrf" {
				continue
			}
			if (k == "key" || k == "error") && h.cfg.HidePayloads {
				v = "(hidden)"
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(k + "=" + strconv.Quote(v))
		}
	}
	return b.String()
}
