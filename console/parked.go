package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

// parkedQuery is the parked page's filter, as in its URL and forms.
type parkedQuery struct {
	Topic string
	Key   string
	Error string
	IDs   string
}

func parkedQueryOf(v url.Values) parkedQuery {
	return parkedQuery{Topic: v.Get("topic"), Key: v.Get("key"), Error: v.Get("error"), IDs: v.Get("ids")}
}

func (q parkedQuery) String() string {
	return fmt.Sprintf("topic=%q key=%q error=%q ids=%q", q.Topic, q.Key, q.Error, q.IDs)
}

// fields are the filter's form fields, by name.
func (q parkedQuery) fields() map[string]string {
	return map[string]string{"topic": q.Topic, "key": q.Key, "error": q.Error, "ids": q.IDs}
}

func (q parkedQuery) values() url.Values { return nonEmpty(q.fields()) }

// nonEmpty is the query string of a filter's fields that are set.
func nonEmpty(fields map[string]string) url.Values {
	v := url.Values{}
	for k, s := range fields {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// filter turns q into an inspect.ParkedFilter; none is false when the key
// matches no parked row (the filter would otherwise select every row).
func (h *Handler) parkedFilter(ctx context.Context, q parkedQuery, limit int) (f inspect.ParkedFilter, none bool, err error) {
	ids, err := parseIDs(q.IDs)
	if err != nil {
		return f, false, err
	}
	f = inspect.ParkedFilter{Topic: q.Topic, ErrorContains: q.Error, IDs: ids, Limit: limit}
	if q.Key == "" {
		return f, false, nil
	}
	byKey, err := inspect.ParkedIDsByKey(ctx, h.cfg.DB, []byte(q.Key), h.cfg.MaxActionRows+1)
	if err != nil {
		return f, false, err
	}
	if ids != nil {
		byKey = slices.DeleteFunc(byKey, func(id int64) bool { return !slices.Contains(ids, id) })
	}
	f.IDs = byKey
	return f, len(byKey) == 0, nil
}

type parkedData struct {
	Q     parkedQuery
	QS    template.URL // the filter as a query string
	Rows  []inspect.ParkedMessage
	Count int64
	Max   int
}

func (h *Handler) parked(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	q := parkedQueryOf(r.URL.Query())
	d := parkedData{Q: q, QS: template.URL(q.values().Encode()), Max: h.cfg.MaxActionRows}
	f, none, err := h.parkedFilter(ctx, q, listLimit)
	if err == nil && !none {
		if d.Rows, err = inspect.ListParked(ctx, h.cfg.DB, f); err == nil {
			d.Count, err = inspect.CountParked(ctx, h.cfg.DB, f)
		}
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, "parked", "Parked rows", d, start)
}

type parkedRowData struct {
	Row *inspect.OutboxRow
}

func (h *Handler) parkedRow(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id, ok := parseID(r.URL.Query().Get("id"))
	if !ok {
		h.fail(w, r, http.StatusBadRequest, "no row id")
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	row, err := inspect.ReadOutboxRow(ctx, h.cfg.DB, id)
	if errors.Is(err, inspect.ErrRowNotFound) {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("outbox row %d is gone (published, discarded or pruned)", id))
		return
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, "parkedrow", fmt.Sprintf("Outbox row %d", id), parkedRowData{Row: row}, start)
}

// confirmData is the confirmation page of an action on many rows.
type confirmData struct {
	Action string // path of the POST
	Verb   string
	What   string
	Fields map[string]string
	Count  int
	Max    int
	Too    bool
}

func (h *Handler) parkedConfirm(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	q := parkedQueryOf(r.URL.Query())
	verb := r.URL.Query().Get("action")
	if verb != "retry" && verb != "discard" {
		h.fail(w, r, http.StatusBadRequest, "action must be retry or discard")
		return
	}
	h.confirm(w, r, start, confirmData{Action: "/parked/" + verb, Verb: verb, What: "parked rows matching " + q.String(), Fields: q.fields()},
		func(ctx context.Context) ([]int64, error) { return h.parkedSelect(ctx, q) })
}

// confirm renders d, the confirmation page of an action, with the number of
// rows pick selects and whether that is more than MaxActionRows.
func (h *Handler) confirm(w http.ResponseWriter, r *http.Request, start time.Time, d confirmData, pick func(context.Context) ([]int64, error)) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	ids, err := pick(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d.Count, d.Max, d.Too = len(ids), h.cfg.MaxActionRows, len(ids) > h.cfg.MaxActionRows
	h.render(w, r, "confirm", "Confirm "+d.Verb, d, start)
}

// parkedSelect lists the ids q selects, at most MaxActionRows+1 (one more
// than allowed shows that the filter is too wide).
func (h *Handler) parkedSelect(ctx context.Context, q parkedQuery) ([]int64, error) {
	f, none, err := h.parkedFilter(ctx, q, h.cfg.MaxActionRows+1)
	if err != nil || none {
		return nil, err
	}
	rows, err := inspect.ListParked(ctx, h.cfg.DB, f)
	return rowIDs(rows, err, func(row inspect.ParkedMessage) int64 { return row.ID })
}

// parkedAct retries or discards the rows the form's filter selects, if
// they are as many as the operator confirmed (expect) and at most
// MaxActionRows. It acts on those ids only.
func (h *Handler) parkedAct(w http.ResponseWriter, r *http.Request, who Identity, name string) {
	q := parkedQueryOf(r.PostForm)
	h.actOn(w, r, who, rowAction{
		name:   name,
		filter: q.String(),
		back:   h.cfg.Prefix + "/parked?" + q.values().Encode(),
		pick:   func(ctx context.Context) ([]int64, error) { return h.parkedSelect(ctx, q) },
		do: func(ctx context.Context, ids []int64) (int64, error) {
			if name == "parked.retry" {
				return inspect.RetryParked(ctx, h.cfg.DB, inspect.ParkedFilter{IDs: ids})
			}
			return inspect.DiscardParked(ctx, h.cfg.DB, inspect.ParkedFilter{IDs: ids})
		},
	})
}

// rowAction is a confirmed action on the rows a form's filter selects.
type rowAction struct {
	name   string // the audit's action name
	filter string // the filter, as the audit records it
	back   string // the list page to return to
	pick   func(ctx context.Context) ([]int64, error)
	do     func(ctx context.Context, ids []int64) (int64, error) // rows it changed
}

// actOn runs a: it picks the ids, refuses (audited) unless they are as many
// as the operator confirmed (expect) and at most MaxActionRows, else audits
// the action, runs it on those ids only and records the outcome. Either way
// it redirects back to the list with the audit row's id.
func (h *Handler) actOn(w http.ResponseWriter, r *http.Request, who Identity, a rowAction) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	ids, err := a.pick(ctx)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	if why := h.bounds(len(ids), r.PostForm.Get("expect")); why != "" {
		id := h.refused(ctx, who, a.name, a.filter, why)
		http.Redirect(w, r, a.back+"&done="+strconv.FormatInt(id, 10), http.StatusSeeOther)
		return
	}
	au, err := h.startAudit(ctx, who, a.name, a.filter)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	n, err := a.do(ctx, ids)
	au.finish(ctx, ids, n, err)
	http.Redirect(w, r, a.back+"&done="+strconv.FormatInt(au.id, 10), http.StatusSeeOther)
}

// bounds checks an action's row count against the confirmed count and
// MaxActionRows; it returns why the action is refused, or "".
func (h *Handler) bounds(n int, expect string) string {
	want, err := strconv.Atoi(expect)
	switch {
	case err != nil:
		return "no confirmed row count"
	case n > h.cfg.MaxActionRows:
		return fmt.Sprintf("the filter selects more than %d rows (the most one action may touch): narrow it", h.cfg.MaxActionRows)
	case n == 0:
		return "the filter selects no rows"
	case n != want:
		return fmt.Sprintf("the filter now selects %d rows, not the %d confirmed: confirm again", n, want)
	}
	return ""
}

// rowIDs is the ids of the rows a list call returned (or its error): what
// an action over "all matching a filter" acts on.
func rowIDs[R any](rows []R, err error, id func(R) int64) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = id(row)
	}
	return ids, nil
}
