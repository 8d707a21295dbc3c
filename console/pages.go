package console

import (
	"cmp"
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
	// Known is false when Kafka did not answer for the topic: its
	// retention.ms, segment.ms and policy are unknown, not zero.
	Known bool
	// Fallback says what happens to the topic's keys of unknown position.
	Fallback string
}

type cleanupData struct {
	Snap     *inspect.Snapshot
	Rules    []rule
	RulesErr string
	Kafka    string // Kafka did not answer in time
	Waits    []inspect.PartitionWait
	Buffer   time.Duration
	Running  bool
	Stats    cleanup.Stats
	Next     time.Time
	Topics   []string
}

func (h *Handler) cleanupPage(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	snap, err := inspect.Read(ctx, h.cfg.DB, h.snapshotConfig()) // the rules below read Kafka once
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := cleanupData{Snap: snap}
	if cut := h.cfg.Inspect.Cutoffs; cut != nil {
		d.Buffer = cmp.Or(cut.Buffer, cleanup.BufferDefault)
		if cut.Buffer < 0 {
			d.Buffer = 0
		}
		reps, down := h.kafkaPlan(r.Context(), snap)
		d.Kafka = down
		for _, tr := range reps {
			d.Rules = append(d.Rules, ruleOf(tr))
		}
		if d.Waits, err = inspect.ExactWaits(ctx, h.cfg.DB, reps, h.cfg.Inspect.ExactLimit); err != nil {
			h.failErr(w, r, err)
			return
		}
		if down == "" {
			snap.ApplyCutoffs(reps, "from Kafka topic configs and log start offsets (time window: retention.ms + segment.ms + buffer)")
		} else {
			snap.Cutoffs = "unknown: " + down
		}
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

// ruleOf is a topic's rule as the cleanup page shows it: what the time rule
// does with keys whose position is unknown, in the words relay cleanup
// prints.
func ruleOf(tr cleanup.TopicReport) rule {
	ru := rule{TopicReport: tr, Known: tr.Reason != cleanup.ReasonKafkaUnreachable}
	if tr.Timed && !tr.Forced {
		ru.Buffer = tr.Window - time.Duration(tr.RetentionMs+tr.SegmentMs)*time.Millisecond
	}
	switch {
	case tr.Timed:
		// Cutoff is now − window, a past time: keys from before it go.
		ru.Fallback = fmt.Sprintf("time rule: keys are kept %s; those from before %s (the cutoff) go", ageText(tr.Window.Seconds()), tr.Cutoff.UTC().Format("2006-01-02 15:04:05Z"))
		if tr.Forced {
			ru.Fallback += ", a forced window"
		}
	case tr.Reason.Transient():
		ru.Fallback = "not pruned this pass: " + reasonText(tr.Reason)
	default:
		ru.Fallback = "never pruned by time: " + reasonText(tr.Reason) + " (only the exact rule lets them go; force a window to prune them)"
	}
	return ru
}

// reasonText says a cleanup reason in words.
func reasonText(r cleanup.Reason) string {
	switch r {
	case cleanup.ReasonKafkaUnreachable:
		return "Kafka unreachable"
	case cleanup.ReasonInfiniteRetention:
		return "infinite retention (retention.ms -1)"
	}
	return string(r)
}

type storyData struct {
	Topic, Key, Event string
	Story             *inspect.Story
}

func (h *Handler) story(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	v := r.URL.Query()
	d := storyData{Topic: strings.TrimSpace(v.Get("topic")), Key: v.Get("key"), Event: strings.TrimSpace(v.Get("event"))}
	fields := map[string]string{"topic": d.Topic, "key": d.Key, "event": d.Event}
	if err := cmp.Or(checkParams(fields), h.hiddenFilter(r, fields)); err != nil {
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
