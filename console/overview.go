package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pgbox/pgbox/cleanup"
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
	// previous overview; HasRate is false when unknown.
	Rate      float64
	HasRate   bool
	Instances []instanceRow
	Parked    int64
	Dead      int64
	// Kafka says why the Kafka-derived parts (inbox windows) are missing:
	// Kafka did not answer within Config.KafkaWait; "" when it did.
	Kafka string
	Chart *chart
	// ChartErr says why there is no chart.
	ChartErr string
}

// instanceRow is a relay instance as the overview shows it: the state
// `relay status` prints, and whether it is a problem.
type instanceRow struct {
	inspect.Instance
	State string
	Bad   bool
	Lanes int
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := h.ctx(r)
	defer cancel()
	// The database's sections first, within QueryTimeout; Kafka's after,
	// within KafkaWait: a Kafka that hangs costs the page a note, not the
	// page.
	snap, err := inspect.Read(ctx, h.cfg.DB, h.snapshotConfig())
	if err != nil {
		h.failErr(w, r, err)
		return
	}
	d := overviewData{Snap: snap, Parked: snap.Outbox.Parked}
	d.Rate, d.HasRate = h.rate()
	if d.Chart, err = h.readChart(ctx); err != nil {
		d.ChartErr = err.Error()
	}
	d.Instances = instanceRows(snap)
	for _, c := range snap.Dead {
		d.Dead += c.Count
	}
	if h.cfg.Inspect.Cutoffs != nil {
		reps, down := h.kafkaPlan(r.Context(), snap)
		if down != "" {
			d.Kafka = down
			snap.Cutoffs = "unknown: " + down
		} else {
			snap.ApplyCutoffs(reps, "from Kafka topic configs and log start offsets (time window: retention.ms + segment.ms + buffer)")
		}
	} else {
		snap.Cutoffs = "unknown: no Kafka admin to read topic configs from"
	}
	d.Warnings = warnings(snap, h.cfg.Cleaner)
	h.render(w, r, "overview", "Overview", d, start)
}

// snapshotConfig is Config.Inspect for a page's snapshot: without Kafka
// (a page reads it once, within KafkaWait) and without counting what each
// of the newest parked rows holds back, which no page shows.
func (h *Handler) snapshotConfig() inspect.Config {
	opts := h.cfg.Inspect
	opts.Cutoffs, opts.HeldScan = nil, -1
	return opts
}

// kafkaPlan reads the cleanup rule of every inbox topic of snap from Kafka,
// waiting at most KafkaWait; down says Kafka did not answer in time.
func (h *Handler) kafkaPlan(ctx context.Context, snap *inspect.Snapshot) (reps []cleanup.TopicReport, down string) {
	kctx, cancel := context.WithTimeout(ctx, h.cfg.KafkaWait)
	defer cancel()
	reps, err := inspect.CleanupPlan(kctx, snap, *h.cfg.Inspect.Cutoffs)
	switch {
	case errors.Is(kctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Sprintf("Kafka is not answering (no answer within %v)", h.cfg.KafkaWait)
	case err != nil:
		return nil, err.Error()
	}
	return reps, ""
}

// instanceRows gives each instance the state relay status prints.
func instanceRows(snap *inspect.Snapshot) []instanceRow {
	held := map[string]int{}
	for _, l := range snap.Lanes {
		if l.Held {
			held[l.Owner]++
		}
	}
	var out []instanceRow
	for _, i := range snap.Instances {
		row := instanceRow{Instance: i, State: snap.InstanceState(i), Lanes: held[i.Instance]}
		row.Bad = !i.Live || i.KafkaDownSince != nil || (!i.KafkaReady && !i.Dormant)
		out = append(out, row)
	}
	return out
}

// rate is the publish rate of this process's relay since the last call;
// ok is false when unknown (no relay here, or the first reading).
func (h *Handler) rate() (perSec float64, ok bool) {
	if h.cfg.Published == nil {
		return 0, false
	}
	now := rateSample{at: time.Now(), published: h.cfg.Published()}
	h.rateMu.Lock()
	last := h.rateLast
	h.rateLast = now
	h.rateMu.Unlock()
	el := now.at.Sub(last.at).Seconds()
	if last.at.IsZero() || el <= 0 || now.published < last.published {
		return 0, false
	}
	return float64(now.published-last.published) / el, true
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
		out = append(out, fmt.Sprintf("Outbox: %s parked rows hold back their keys until retried or discarded.", cappedText(s.Outbox.Parked, s.Outbox.ParkedCapped)))
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
