package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
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

func parkedQueryOf(v url.Values) (parkedQuery, error) {
	q := parkedQuery{Topic: v.Get("topic"), Key: v.Get("key"), Error: v.Get("error"), IDs: v.Get("ids")}
	return q, checkParams(q.fields())
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

// parkedFilter turns q into an inspect.ParkedFilter; every condition
// (topic, key, error text, ids) goes to the one statement, so its limit
// applies after all of them. Pages do not show what a parked row holds
// back: the filter counts none of it (HeldScan -1).
func (h *Handler) parkedFilter(q parkedQuery, limit int) (inspect.ParkedFilter, error) {
	ids, err := parseIDs("ids", q.IDs)
	if err != nil {
		return inspect.ParkedFilter{}, err
	}
	f := inspect.ParkedFilter{Topic: q.Topic, ErrorContains: q.Error, IDs: ids, Limit: limit, HeldScan: -1}
	if q.Key != "" {
		f.Key = []byte(q.Key)
	}
	return f, nil
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
	q, err := parkedQueryOf(r.URL.Query())
	err = cmp.Or(err, h.hiddenFilter(r, q.fields()))
	d := parkedData{Q: q, QS: template.URL(q.values().Encode()), Max: h.cfg.MaxActionRows}
	var f inspect.ParkedFilter
	if err == nil {
		f, err = h.parkedFilter(q, listLimit)
	}
	if err == nil {
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
	id, err := paramID(r.URL.Query(), "id")
	if err != nil {
		h.failErr(w, r, err)
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

func (h *Handler) parkedConfirm(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	q, err := parkedQueryOf(r.URL.Query())
	err = cmp.Or(err, h.hiddenFilter(r, q.fields()))
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	verb := r.URL.Query().Get("action")
	if verb != "retry" && verb != "discard" {
		h.failErr(w, r, &badParam{name: "action", want: "must be retry or discard"})
		return
	}
	h.confirm(w, r, start, confirmData{Action: "/parked/" + verb, Verb: verb, Noun: "parked row", What: q.String(), Fields: q.fields(),
		Back: h.cfg.Prefix + "/parked?" + q.values().Encode(), RowPath: "/parked/row"},
		func(ctx context.Context) ([]picked, error) { return h.parkedSelect(ctx, q) })
}

// parkedSelect lists the rows q selects, at most MaxActionRows+1 (one more
// than allowed shows that the filter is too wide).
func (h *Handler) parkedSelect(ctx context.Context, q parkedQuery) ([]picked, error) {
	f, err := h.parkedFilter(q, h.cfg.MaxActionRows+1)
	if err != nil {
		return nil, err
	}
	rows, err := inspect.ListParked(ctx, h.cfg.DB, f)
	return pickRows(rows, err, func(row inspect.ParkedMessage) picked {
		return picked{ID: row.ID, What: row.Topic + " " + h.keyText(row.Key), Error: row.LastError}
	})
}

// parkedAct retries or discards the rows the operator confirmed (see actOn).
func (h *Handler) parkedAct(w http.ResponseWriter, r *http.Request, who Identity, name string) {
	q, err := parkedQueryOf(r.PostForm)
	h.actOn(w, r, who, rowAction{
		name:    name,
		badForm: err,
		back:    h.cfg.Prefix + "/parked?" + q.values().Encode(),
		pick:    func(ctx context.Context) ([]picked, error) { return h.parkedSelect(ctx, q) },
		do: func(ctx context.Context, rows []picked) (int64, error) {
			ids := pickedIDs(rows)
			if name == "parked.retry" {
				return inspect.RetryParked(ctx, h.cfg.DB, inspect.ParkedFilter{IDs: ids})
			}
			return inspect.DiscardParked(ctx, h.cfg.DB, inspect.ParkedFilter{IDs: ids})
		},
	})
}
