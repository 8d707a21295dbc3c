package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

// deadQuery is the dead-letter page's filter.
type deadQuery struct {
	Consumer string
	Topic    string
	Key      string
	Error    string
	IDs      string
}

func deadQueryOf(v url.Values) (deadQuery, error) {
	q := deadQuery{Consumer: v.Get("consumer"), Topic: v.Get("topic"), Key: v.Get("key"), Error: v.Get("error"), IDs: v.Get("ids")}
	return q, checkParams(q.fields())
}

func (q deadQuery) String() string {
	return fmt.Sprintf("consumer=%q topic=%q key=%q error=%q ids=%q", q.Consumer, q.Topic, q.Key, q.Error, q.IDs)
}

// fields are the filter's form fields, by name.
func (q deadQuery) fields() map[string]string {
	return map[string]string{"consumer": q.Consumer, "topic": q.Topic, "key": q.Key, "error": q.Error, "ids": q.IDs}
}

func (q deadQuery) values() url.Values { return nonEmpty(q.fields()) }

// deadFilter turns q into an inspect.DeadFilter; every condition
// (consumer, topic, key, error text, ids) goes to the one statement, so its
// limit applies after all of them.
func (h *Handler) deadFilter(q deadQuery, limit int) (inspect.DeadFilter, error) {
	ids, err := parseIDs("ids", q.IDs)
	if err != nil {
		return inspect.DeadFilter{}, err
	}
	return inspect.DeadFilter{Consumer: q.Consumer, Topic: q.Topic, Key: q.Key, ErrorContains: q.Error, IDs: ids, Limit: limit}, nil
}

type deadData struct {
	Q    deadQuery
	QS   template.URL // the filter as a query string
	Rows []inspect.DeadLetter
	Max  int
}

func (h *Handler) dead(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	q, err := deadQueryOf(r.URL.Query())
	err = cmp.Or(err, h.hiddenFilter(r, q.fields()))
	d := deadData{Q: q, QS: template.URL(q.values().Encode()), Max: h.cfg.MaxActionRows}
	var f inspect.DeadFilter
	if err == nil {
		f, err = h.deadFilter(q, listLimit)
	}
	if err == nil {
		d.Rows, err = inspect.ListDead(ctx, h.cfg.DB, f)
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, "dead", "Dead letters", d, start)
}

func (h *Handler) deadRow(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id, err := paramID(r.URL.Query(), "id")
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	rec, err := inspect.ReadDeadRecord(ctx, h.cfg.DB, id)
	if errors.Is(err, inspect.ErrRowNotFound) {
		h.fail(w, r, http.StatusNotFound, fmt.Sprintf("dead letter %d is gone (pruned)", id))
		return
	}
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, "deadrow", fmt.Sprintf("Dead letter %d", id), rec, start)
}

func (h *Handler) deadConfirm(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	q, err := deadQueryOf(r.URL.Query())
	err = cmp.Or(err, h.hiddenFilter(r, q.fields()))
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	again := r.URL.Query().Get("again")
	verb := "replay"
	if again != "" {
		verb = "replay again"
	}
	fields := q.fields()
	fields["again"] = again
	h.confirm(w, r, start, confirmData{Action: "/dead/replay", Verb: verb, Noun: "dead letter", What: q.String(), Fields: fields,
		Back: h.cfg.Prefix + "/dead?" + q.values().Encode(), RowPath: "/dead/row", StateField: deadStateField, StateHead: "Replays"},
		func(ctx context.Context) ([]picked, error) { return h.deadSelect(ctx, q) })
}

func (h *Handler) deadSelect(ctx context.Context, q deadQuery) ([]picked, error) {
	f, err := h.deadFilter(q, h.cfg.MaxActionRows+1)
	if err != nil {
		return nil, err
	}
	rows, err := inspect.ListDead(ctx, h.cfg.DB, f)
	return pickRows(rows, err, func(row inspect.DeadLetter) picked {
		what := row.Consumer + " " + fmt.Sprintf("%s/%d@%d", row.Topic, row.Partition, row.Offset)
		return picked{ID: row.ID, What: what, Error: row.Error, State: strconv.Itoa(row.Replays)}
	})
}

// deadStateField is the confirmation form's field with the dead letters'
// replay counts: a replay (again or not) runs only on the counts the
// operator saw.
const deadStateField = "replays"

// deadReplay replays the dead letters the operator confirmed (again: those
// replayed before too), as actOn.
func (h *Handler) deadReplay(w http.ResponseWriter, r *http.Request, who Identity, name string) {
	q, err := deadQueryOf(r.PostForm)
	again := r.PostForm.Get("again") != ""
	if again {
		name = "dead.replay_again"
	}
	h.actOn(w, r, who, rowAction{
		name:       name,
		badForm:    err,
		back:       h.cfg.Prefix + "/dead?" + q.values().Encode(),
		stateField: deadStateField,
		stateWhat:  "replay counts",
		pick:       func(ctx context.Context) ([]picked, error) { return h.deadSelect(ctx, q) },
		do: func(ctx context.Context, rows []picked) (int64, error) {
			// The counts confirmed are checked again under the rows' locks:
			// two submits that both passed actOn's check replay once.
			confirmed := make(map[int64]int, len(rows))
			for _, p := range rows {
				confirmed[p.ID], _ = strconv.Atoi(p.State)
			}
			res, err := inspect.ReplayDead(ctx, h.cfg.DB, pickedIDs(rows), inspect.ReplayConfig{Again: again, Replays: confirmed})
			if errors.Is(err, inspect.ErrReplaysChanged) {
				return 0, &refusal{why: changedWhy("replay counts")}
			}
			var n int64
			for _, rp := range res {
				if !rp.Skipped {
					n++
				}
			}
			return n, err
		},
	})
}
