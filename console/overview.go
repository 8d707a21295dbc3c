package console

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

// rateSample is one reading of Config.Published.
type rateSample struct {
	at        time.Time
	published uint64
}

// overviewData is the overview page's content.
type overviewData struct {
	Snap     *inspect.Snapshot
	Warnings []string
	// Rate is rows published per second by this process's relay since the
	// previous overview; nil when unknown.
	Rate      *float64
	LanesHeld map[string]int
	Sleeping  map[string]bool
	Parked    int64
	Dead      int64
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	snap, err := inspect.Read(ctx, h.cfg.DB, h.cfg.Inspect)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	sleeping, err := inspect.InstancesSleeping(ctx, h.cfg.DB)
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := overviewData{Snap: snap, Rate: h.rate(), LanesHeld: map[string]int{}, Sleeping: sleeping, Parked: snap.Outbox.Parked, Warnings: warnings(snap, h.cfg.Cleaner)}
	for _, l := range snap.Lanes {
		if l.Held {
			d.LanesHeld[l.Owner]++
		}
	}
	for _, c := range snap.Dead {
		d.Dead += c.Count
	}
	h.render(w, r, "overview", "Overview", d, start)
}

// rate is the publish rate of this process's relay since the last call.
func (h *Handler) rate() *float64 {
	if h.cfg.Published == nil {
		return nil
	}
	now := rateSample{at: time.Now(), published: h.cfg.Published()}
	h.rateMu.Lock()
	last := h.rateLast
	h.rateLast = now
	h.rateMu.Unlock()
	el := now.at.Sub(last.at).Seconds()
	if last.at.IsZero() || el <= 0 || now.published < last.published {
		return nil
	}
	v := float64(now.published-last.published) / el
	return &v
}

// warnings lists where the dedup guarantee is at risk or work is stuck.
func warnings(s *inspect.Snapshot, cl CleanerStats) []string {
	var out []string
	for _, in := range s.Inbox {
		switch {
		case in.Margin != nil && *in.Margin < 0:
			out = append(out, fmt.Sprintf("Consumer %s, topic %s: the oldest inbox key is %s older than the cleanup cutoff; cleanup is not keeping up (is it running?).",
				in.Consumer, in.Topic, ageText(-*in.Margin)))
		case in.Margin != nil && in.Window != nil && *in.Margin < *in.Window/10:
			out = append(out, fmt.Sprintf("Consumer %s, topic %s: the oldest inbox key is within %s of its cleanup cutoff.", in.Consumer, in.Topic, ageText(*in.Margin)))
		case strings.Contains(in.Note, "never pruned"):
			// No time window: only Kafka moving the partition's log start
			// (DeleteRecords, retention.bytes) lets a key go, and a topic
			// kept forever never moves it by itself.
			_, why, _ := strings.Cut(in.Note, "never pruned")
			why = strings.TrimPrefix(strings.TrimPrefix(why, " by time"), ": ")
			out = append(out, fmt.Sprintf("Consumer %s, topic %s: %s keys kept until Kafka's log start passes them (%s); the inbox grows without bound unless a window is forced.",
				in.Consumer, in.Topic, countText(in.Keys, in.Estimated), why))
		}
	}
	if cl != nil {
		if st := cl.Stats(); st.PassErrors > 0 {
			out = append(out, fmt.Sprintf("Cleanup: %d passes failed since this process started (see its log).", st.PassErrors))
		}
	}
	out = append(out, horizonWarnings(s)...)
	if s.Outbox.Parked > 0 {
		out = append(out, fmt.Sprintf("Outbox: %s parked rows hold back their keys until retried or discarded.", countText(s.Outbox.Parked, s.Outbox.ParkedCapped)))
	}
	live := 0
	for _, i := range s.Instances {
		if i.Live {
			live++
		}
	}
	if s.Outbox.Unpublished > 0 && live == 0 {
		out = append(out, "Outbox: rows wait and no relay instance is live.")
	}
	return out
}
