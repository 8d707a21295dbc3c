package console

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The overview's chart: the last hour of each topic's outbox backlog and
// publish rate, from the samples the relay's heartbeat writes to
// pgbox_relay_history (migration 00110), drawn on the server as SVG (no
// script: the Content-Security-Policy allows none).
const (
	chartSpan   = time.Hour
	chartBin    = time.Minute
	chartTopics = 8 // the busiest topics get a line each
	chartW      = 560
	chartH      = 160
)

// chartColors tell the topics' lines apart (presentation attributes, which
// the style-src policy allows).
var chartColors = []string{"#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"}

// chart is both panels and their legend.
type chart struct {
	Samples   int // sample times in the last hour: 0 means the relay records none
	Backlog   panel
	Rate      panel
	Legend    []legend
	MoreTopic int // topics left out of the lines
}

type panel struct {
	Title string
	Max   string // the y axis' top, as text
	Lines []line
	W, H  int
}

type line struct {
	Topic  string
	Color  string
	Points string // SVG polyline points
	// Dot marks the point of a line of one sample, which a polyline does
	// not draw; nil when the line has two or more.
	Dot *point
}

type point struct{ X, Y float64 }

type legend struct{ Topic, Color string }

// sample is one topic's figures in one time bin.
type sample struct {
	backlog   int64
	published int64
}

// readChart reads the last hour's samples and lays out both panels.
func (h *Handler) readChart(ctx context.Context) (*chart, error) {
	rows, err := h.cfg.DB.Query(ctx, sqlHistory, chartSpan.Seconds(), chartBin.Seconds())
	if err != nil {
		return nil, fmt.Errorf("console: read pgbox_relay_history (run `relay migrate up` if it is missing): %w", err)
	}
	var (
		at     time.Time
		topic  string
		s      sample
		bins   []time.Time
		series = map[string]map[time.Time]sample{}
	)
	_, err = pgx.ForEachRow(rows, []any{&at, &topic, &s.backlog, &s.published}, func() error {
		if len(bins) == 0 || !bins[len(bins)-1].Equal(at) {
			bins = append(bins, at)
		}
		if topic != "" {
			if series[topic] == nil {
				series[topic] = map[time.Time]sample{}
			}
			series[topic][at] = s
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: read pgbox_relay_history: %w", err)
	}
	return layout(time.Now(), bins, series), nil
}

// layout draws the busiest topics' lines over the last hour ending at now.
func layout(now time.Time, bins []time.Time, series map[string]map[time.Time]sample) *chart {
	c := &chart{Samples: len(bins), Backlog: panel{Title: "Backlog (unpublished rows)", W: chartW, H: chartH},
		Rate: panel{Title: "Published (rows/s)", W: chartW, H: chartH}}
	type weight struct {
		topic string
		peak  int64
	}
	var ws []weight
	var maxBacklog, maxPublished int64
	for t, byBin := range series {
		var peak int64
		for _, s := range byBin {
			peak = max(peak, s.backlog, s.published)
			maxBacklog, maxPublished = max(maxBacklog, s.backlog), max(maxPublished, s.published)
		}
		ws = append(ws, weight{t, peak})
	}
	slices.SortFunc(ws, func(a, b weight) int { return cmp.Or(cmp.Compare(b.peak, a.peak), strings.Compare(a.topic, b.topic)) })
	if len(ws) > chartTopics {
		c.MoreTopic = len(ws) - chartTopics
		ws = ws[:chartTopics]
	}
	binSec := chartBin.Seconds()
	c.Backlog.Max = thousands(maxBacklog)
	c.Rate.Max = strconv.FormatFloat(float64(maxPublished)/binSec, 'f', 1, 64)
	x := func(t time.Time) float64 {
		return float64(chartW) * (1 - now.Sub(t).Seconds()/chartSpan.Seconds())
	}
	y := func(v, top int64) float64 {
		if top == 0 {
			return chartH
		}
		return chartH * (1 - float64(v)/float64(top))
	}
	for i, w := range ws {
		color := chartColors[i%len(chartColors)]
		bl, rl := line{Topic: w.topic, Color: color}, line{Topic: w.topic, Color: color}
		var bp, rp strings.Builder
		for _, b := range bins {
			s := series[w.topic][b] // a bin without the topic: nothing waited, nothing sent
			bx, by, ry := x(b), y(s.backlog, maxBacklog), y(s.published, maxPublished)
			fmt.Fprintf(&bp, "%.1f,%.1f ", bx, by)
			fmt.Fprintf(&rp, "%.1f,%.1f ", bx, ry)
			if len(bins) == 1 {
				bl.Dot, rl.Dot = &point{bx, by}, &point{bx, ry}
			}
		}
		bl.Points, rl.Points = strings.TrimSpace(bp.String()), strings.TrimSpace(rp.String())
		c.Backlog.Lines = append(c.Backlog.Lines, bl)
		c.Rate.Lines = append(c.Rate.Lines, rl)
		c.Legend = append(c.Legend, legend{Topic: w.topic, Color: color})
	}
	return c
}
