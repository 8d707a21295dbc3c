package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// badParam is a request parameter the console cannot use: the request gets
// a 400 (or status) naming the parameter and what it must be.
type badParam struct {
	name   string // the parameter
	want   string // what it must be
	status int    // 0: 400
}

func (e *badParam) Error() string { return "parameter " + e.name + " " + e.want }

// checkParams refuses text parameters PostgreSQL cannot take as text:
// invalid UTF-8, or a NUL byte.
func checkParams(fields map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if v := fields[k]; !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return &badParam{name: k, want: "must be UTF-8 text without NUL bytes"}
		}
	}
	return nil
}

// hiddenFilter refuses a viewer's filter over text the console hides
// (Config.HidePayloads): a key, an error text. Each answer would say
// whether the hidden text holds what was typed, so a viewer could read a
// key or a card number in a handler's error a character at a time, or
// confirm that an exact key exists. Operators keep these filters: they act
// on the rows, and the audit trail records what they asked.
func (h *Handler) hiddenFilter(r *http.Request, fields map[string]string) error {
	if !h.cfg.HidePayloads {
		return nil
	}
	if who, _ := IdentityFrom(r.Context()); who.Operator() {
		return nil
	}
	for _, k := range []string{"key", "error"} {
		if fields[k] != "" {
			return &badParam{name: k, status: http.StatusForbidden,
				want: "needs the operator role while payloads are hidden (--console-hide-payloads): a filter over hidden text would reveal it"}
		}
	}
	return nil
}

func parseID(s string) (int64, bool) {
	id, err := strconv.ParseInt(s, 10, 64)
	return id, err == nil && id > 0
}

// paramID reads the row id parameter name.
func paramID(v url.Values, name string) (int64, error) {
	id, ok := parseID(v.Get(name))
	if !ok {
		return 0, &badParam{name: name, want: fmt.Sprintf("must be a positive row id (got %q)", v.Get(name))}
	}
	return id, nil
}

// parseIDs reads the comma-separated id list of parameter name ("" is none).
func parseIDs(name, s string) ([]int64, error) {
	var ids []int64
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		id, ok := parseID(f)
		if !ok {
			return nil, &badParam{name: name, want: fmt.Sprintf("must be a comma-separated list of positive row ids (%q is not one)", f)}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// picked is one row an action would touch, as its confirmation lists it.
type picked struct {
	ID    int64
	What  string // topic and key, or consumer and position
	Error string
	// State is what of the row the action must find unchanged besides its
	// presence (a dead letter's replay count); "" when nothing.
	State string
}

// pickRows is the rows a list call returned (or its error) as an action
// over "all matching a filter" acts on them.
func pickRows[R any](rows []R, err error, pick func(R) picked) ([]picked, error) {
	if err != nil {
		return nil, err
	}
	out := make([]picked, len(rows))
	for i, row := range rows {
		out[i] = pick(row)
	}
	return out, nil
}

// pickedStates is the rows' states in order, comma-separated: what a
// confirmation's form carries in its state field.
func pickedStates(rows []picked) string {
	states := make([]string, len(rows))
	for i, p := range rows {
		states[i] = p.State
	}
	return strings.Join(states, ",")
}

func pickedIDs(rows []picked) []int64 {
	ids := make([]int64, len(rows))
	for i, p := range rows {
		ids[i] = p.ID
	}
	return ids
}

// confirmShown is how many rows a confirmation page lists; it counts the rest.
const confirmShown = 20

// confirmData is the confirmation page of an action on many rows.
type confirmData struct {
	Action  string // path of the POST
	Verb    string
	Noun    string // "parked row", "dead letter"
	What    string // the filter
	Fields  map[string]string
	Back    string // the list the cancel link returns to
	RowPath string // a row's page
	// StateField names the form field carrying the rows' states, StateHead
	// their column's heading; "" for an action that checks none.
	StateField string
	StateHead  string
	States     string
	Rows       []picked
	More       int    // rows not listed
	IDs        string // every row's id: the form's "confirmed"
	Count      int
	Max        int
	Too        bool
}

// confirm renders d, the confirmation page of an action, listing the rows
// pick selects; its form carries their ids, and the action touches those
// rows or none (actOn).
func (h *Handler) confirm(w http.ResponseWriter, r *http.Request, start time.Time, d confirmData, pick func(context.Context) ([]picked, error)) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	rows, err := pick(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d.Count, d.Max, d.Too = len(rows), h.cfg.MaxActionRows, len(rows) > h.cfg.MaxActionRows
	if !d.Too {
		d.IDs = joinIDs(pickedIDs(rows))
		if d.StateField != "" {
			d.States = pickedStates(rows)
		}
		d.Rows = rows[:min(len(rows), confirmShown)]
		d.More = len(rows) - len(d.Rows)
	}
	h.render(w, r, "confirm", "Confirm "+d.Verb, d, start)
}

func joinIDs(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// rowAction is a confirmed action on the rows a form's filter selects.
type rowAction struct {
	name    string // the audit's action name
	badForm error  // the form's filter could not be read
	back    string // the list page to return to
	// stateField names the form field with the rows' confirmed states
	// (confirmData.StateField); "" checks none.
	stateField string
	// what the states are, for a refusal ("replay counts")
	stateWhat string
	pick      func(ctx context.Context) ([]picked, error)
	// do acts on the rows, which have the states confirmed; it returns how
	// many rows it changed, or a *refusal when it found a row changed after
	// all (another action that ran meanwhile).
	do func(ctx context.Context, rows []picked) (int64, error)
}

// refusal is an action that found its rows changed while it ran: it did
// nothing, and its audit record says "refused: " and why.
type refusal struct{ why string }

func (r *refusal) Error() string { return r.why }

// changedWhy is the refusal of an action whose rows' states (what) changed
// since the confirmation.
func changedWhy(what string) string {
	return "the " + what + " changed since the confirmation (another action ran meanwhile): confirm again"
}

// actOn runs a on exactly the rows the operator confirmed (the form's
// "confirmed" ids, and their states when the action has any): it picks the
// rows the filter selects now and refuses (audited) unless they are those
// rows, in those states, and at most MaxActionRows, so a row gone
// meanwhile, one that joined the filter since the confirmation page or a
// dead letter replayed since (a double submit, a second operator) stops
// the action. Otherwise it audits the action, runs it on those ids and
// records the outcome. Either way it redirects back to the list with the
// audit row's id; a form it cannot read gets a 400, audited.
func (h *Handler) actOn(w http.ResponseWriter, r *http.Request, who Identity, a rowAction) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	target := h.target(r.PostForm)
	confirmed, err := parseIDs("confirmed", r.PostForm.Get("confirmed"))
	err = cmp.Or(a.badForm, err)
	var rows []picked
	if err == nil {
		rows, err = a.pick(ctx)
	}
	var bad *badParam
	if errors.As(err, &bad) {
		h.refused(ctx, who, a.name, target, bad.Error())
		h.fail(w, r, http.StatusBadRequest, bad.Error())
		return
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	ids := pickedIDs(rows)
	why := h.bounds(ids, confirmed)
	if why == "" && a.stateField != "" && pickedStates(rows) != r.PostForm.Get(a.stateField) {
		why = changedWhy(a.stateWhat)
	}
	if why != "" {
		id := h.refused(ctx, who, a.name, target, why)
		http.Redirect(w, r, a.back+"&done="+strconv.FormatInt(id, 10), http.StatusSeeOther)
		return
	}
	au, err := h.startAudit(ctx, who, a.name, target)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	n, err := a.do(ctx, rows)
	au.finish(ctx, ids, n, err)
	http.Redirect(w, r, a.back+"&done="+strconv.FormatInt(au.id, 10), http.StatusSeeOther)
}

// bounds checks the rows an action selects now against the rows the
// operator confirmed and MaxActionRows; it returns why the action is
// refused, or "".
func (h *Handler) bounds(ids, confirmed []int64) string {
	slices.Sort(ids)
	confirmed = slices.Compact(slices.Sorted(slices.Values(confirmed)))
	switch {
	case len(confirmed) == 0:
		return "no confirmed rows (the form carries the ids its confirmation showed)"
	case len(ids) > h.cfg.MaxActionRows:
		return fmt.Sprintf("the filter selects more than %d rows (the most one action may touch): narrow it", h.cfg.MaxActionRows)
	case len(ids) == 0:
		return "the filter selects no rows"
	case !slices.Equal(ids, confirmed):
		return fmt.Sprintf("the rows changed since the confirmation (the filter now selects %s, not the %s confirmed): confirm again",
			rowsText(len(ids)), rowsText(len(confirmed)))
	}
	return ""
}

// rowsText is "1 row" or "n rows".
func rowsText(n int) string {
	if n == 1 {
		return "1 row"
	}
	return thousands(int64(n)) + " rows"
}
