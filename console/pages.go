package console

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/inspect"
)

// rule is one topic's cleanup rule with its buffer: the window less
// Kafka's retention.ms and segment.ms (zero for a forced window).
type rule struct {
	cleanup.TopicReport
	Buffer time.Duration
}

type cleanupData struct {
	Snap     *inspect.Snapshot
	Rules    []rule
	RulesErr string
	Running  bool
	Stats    cleanup.Stats
	Next     time.Time
	Topics   []string
}

func (h *Handler) cleanupPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	opts := h.cfg.Inspect
	opts.Cutoffs = nil // the rules below read Kafka once
	snap, err := inspect.Read(ctx, h.cfg.DB, opts)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := cleanupData{Snap: snap}
	if h.cfg.Inspect.Cutoffs != nil {
		reps, err := inspect.CleanupPlan(ctx, snap, *h.cfg.Inspect.Cutoffs)
		if err != nil {
			d.RulesErr = err.Error()
		}
		for _, tr := range reps {
			ru := rule{TopicReport: tr}
			if !tr.Skipped && !tr.Forced {
				ru.Buffer = tr.Window - time.Duration(tr.RetentionMs+tr.SegmentMs)*time.Millisecond
			}
			d.Rules = append(d.Rules, ru)
		}
		snap.ApplyCutoffs(reps, "from Kafka topic configs (retention.ms + segment.ms + buffer)")
	} else {
		d.RulesErr = "no Kafka admin configured: the rules are unknown here"
	}
	if h.cfg.Cleaner != nil {
		d.Running, d.Stats = true, h.cfg.Cleaner.Stats()
		if !d.Stats.LastPass.IsZero() {
			d.Next = d.Stats.LastPass.Add(h.cfg.CleanupInterval)
		}
		for t := range d.Stats.Topics {
			d.Topics = append(d.Topics, t)
		}
		slices.Sort(d.Topics)
	}
	h.render(w, r, "cleanup", "Cleanup", d, start)
}

type storyData struct {
	Topic, Key, Event string
	Story             *inspect.Story
}

func (h *Handler) story(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	v := r.URL.Query()
	d := storyData{Topic: strings.TrimSpace(v.Get("topic")), Key: v.Get("key"), Event: strings.TrimSpace(v.Get("event"))}
	if err := checkParams(map[string]string{"topic": d.Topic, "key": d.Key, "event": d.Event}); err != nil {
		h.failErr(w, r, err)
		return
	}
	if d.Event != "" && !uuidRe.MatchString(d.Event) {
		h.failErr(w, r, &badParam{name: "event", want: fmt.Sprintf("must be an event id, a UUID such as 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b (got %q)", d.Event)})
		return
	}
	if d.Key != "" || d.Event != "" {
		ctx, cancel := h.ctx(r)
		defer cancel()
		q := inspect.StoryQuery{Topic: d.Topic, EventID: d.Event}
		if d.Key != "" {
			q.Key = []byte(d.Key)
		}
		st, err := inspect.ReadStory(ctx, h.cfg.DB, q)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		d.Story = st
	}
	h.render(w, r, "story", "A key's story", d, start)
}

func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	recs, err := ReadAudit(ctx, h.cfg.DB, auditList)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	h.render(w, r, "audit", "Audit trail", recs, start)
}
