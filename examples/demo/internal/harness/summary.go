package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/internal/durtext"
)

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Summary prints the table and checks the two promises: one charge and one
// payment per unique order.
func (h *Harness) Summary(ctx context.Context, took time.Duration, cr cleanup.Report) error {
	var rows, distinct int64
	if err := h.svc.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM demo_charges`).Scan(&rows, &distinct); err != nil {
		return fmt.Errorf("count demo_charges: %w", err)
	}
	var unpublished int64
	_ = h.svc.Pool.QueryRow(ctx, `SELECT count(*) FROM pgbox_outbox`).Scan(&unpublished)
	st := h.svc.Consumer.Stats()
	h.mu.Lock()
	lat := slices.Clone(h.latencies)
	multi := 0
	for _, ids := range h.seen {
		if len(ids) > 1 {
			multi++
		}
	}
	h.mu.Unlock()
	slices.Sort(lat)
	unique := int64(h.cfg.Orders)
	injected := h.counters.resent.Load() + h.counters.replayed.Load()

	okRows := rows == unique && distinct == unique
	okPays := h.counters.paymentsUnique.Load() == unique && multi == 0
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAILED"
	}
	w := h.stdout
	fmt.Fprintf(w, "\npgbox demo: orders → payments, exactly-once in effect (%s)\n\n", took.Round(10*time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "orders sent (unique)\t%d\t\n", unique)
	fmt.Fprintf(tw, "  resends injected\t%d\tsame order id, sent twice\n", h.counters.resent.Load())
	fmt.Fprintf(tw, "  replayed from an earlier offset\t%d\tre-published range of the orders topic\n", h.counters.replayed.Load())
	fmt.Fprintf(tw, "deliveries to the service\t%d\tacross %d consumer-group members\n", st.Processed+st.Duplicates, h.cfg.Consumers)
	fmt.Fprintf(tw, "duplicates skipped (inbox)\t%d\t%d injected; redeliveries after a rebalance add to it\n", st.Duplicates, injected)
	fmt.Fprintf(tw, "business rows (demo_charges)\t%d\t%s: %s unique orders (%d distinct order ids)\n", rows, mark(okRows), eqWord(okRows), distinct)
	fmt.Fprintf(tw, "payments published\t%d\t%s: %d of %d orders paid, %d paid more than once (%d records read; a re-sent event id is not a second payment)\n",
		h.counters.paymentsUnique.Load(), mark(okPays), h.counters.paymentsUnique.Load(), unique, multi, h.counters.paymentsRead.Load())
	fmt.Fprintf(tw, "end-to-end latency p50 / p99\t%s / %s\torder sent → payment read, over %d payments\n",
		percentile(lat, .50).Round(time.Millisecond), percentile(lat, .99).Round(time.Millisecond), len(lat))
	fmt.Fprintf(tw, "dead-lettered\t%d\t\n", st.DeadLettered)
	fmt.Fprintf(tw, "outbox rows left\t%d\t\n", unpublished)
	fmt.Fprintf(tw, "cleanup (one pass)\t%d deleted\t%s\n", cr.Deleted, cleanupNote(cr, h.Orders))
	_ = tw.Flush()
	if h.cfg.KeepSchema {
		fmt.Fprintf(w, "\nThe demo's tables are in schema %q: try `relay status --schema %s`.\n", h.cfg.Schema, h.cfg.Schema)
	}
	if !okRows || !okPays {
		fmt.Fprintln(w, "\nFAIL")
		return fmt.Errorf("demo check failed: %d business rows, %d paid orders and %d paid more than once, for %d unique orders", rows, h.counters.paymentsUnique.Load(), multi, unique)
	}
	fmt.Fprintln(w, "\nPASS: every order charged once and paid once, despite the duplicates.")
	return nil
}

func eqWord(ok bool) string {
	if ok {
		return "equals"
	}
	return "DIFFERS FROM"
}

func cleanupNote(cr cleanup.Report, topic string) string {
	tr, ok := cr.Topic(topic)
	switch {
	case cr.Locked:
		return "another cleaner held the cleanup lease"
	case !ok:
		return "no inbox keys"
	case tr.Skipped:
		return fmt.Sprintf("%s keys kept: %s", topic, tr.Note())
	}
	return fmt.Sprintf("%s keys are kept until Kafka's log start passes their last copy (now %v), and at least the buffer (oldest is %s old)",
		topic, tr.LogStarts, durtext.Short(tr.OldestAge))
}

// Progress prints a live status line: rewritten in place on a terminal,
// plain lines every few seconds otherwise.
type Progress struct {
	w   io.Writer
	tty bool
	mu  sync.Mutex
}

// NewProgress returns a progress line on w.
func NewProgress(w io.Writer) *Progress {
	p := &Progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			p.tty = true
		}
	}
	return p
}

// Line prints one line above the progress line.
func (p *Progress) Line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// Run updates the line from status until the returned stop is called.
func (p *Progress) Run(ctx context.Context, status func() string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	every := 2 * time.Second
	if p.tty {
		every = 150 * time.Millisecond
	}
	start := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		last := 0
		for {
			select {
			case <-ctx.Done():
				s := fmt.Sprintf("[%5.1fs] %s", time.Since(start).Seconds(), status())
				p.mu.Lock()
				if p.tty {
					fmt.Fprintf(p.w, "\r%-*s\n", last, s)
				} else {
					fmt.Fprintln(p.w, s)
				}
				p.mu.Unlock()
				return
			case <-t.C:
				s := fmt.Sprintf("[%5.1fs] %s", time.Since(start).Seconds(), status())
				p.mu.Lock()
				if p.tty {
					fmt.Fprintf(p.w, "\r%-*s", last, s)
					last = len(s)
				} else {
					fmt.Fprintln(p.w, s)
				}
				p.mu.Unlock()
			}
		}
	}()
	return func() { cancel(); <-done }
}
