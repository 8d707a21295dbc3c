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
// a 400 naming the parameter and what it must be.
type badParam struct {
	name string // the parameter
	want string // what it must be
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
	Rows    []picked
	More    int    // rows not listed
	IDs     string // every row's id: the form's "confirmed"
	Count   int
	Max     int
	Too     bool
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
	pick    func(ctx context.Context) ([]picked, error)
	do      func(ctx context.Context, ids []int64) (int64, error) // rows it changed
}

// actOn runs a on exactly the rows the operator confirmed (the form's
// "confirmed" ids): it picks the rows the filter selects now and refuses
// (audited) unless they are those rows and at most MaxActionRows, so a row
// gone meanwhile or one that joined the filter since the confirmation page
// stops the action. Otherwise it audits the action, runs it on those ids and
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
	if why := h.bounds(ids, confirmed); why != "" {
		id := h.refused(ctx, who, a.name, target, why)
		http.Redirect(w, r, a.back+"&done="+strconv.FormatInt(id, 10), http.StatusSeeOther)
		return
	}
	au, err := h.startAudit(ctx, who, a.name, target)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	n, err := a.do(ctx, ids)
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
