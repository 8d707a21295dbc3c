package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/internal/testdb"
	"github.com/pgbox/pgbox/outbox"
)

// gather returns the value of every unlabelled metric of the exporter.
func gather(t *testing.T, e *exporter) map[string]float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Counter != nil:
				out[mf.GetName()] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestExporterDedupHits: an in-process inbox's duplicates are exported as
// pgbox_inbox_duplicates_total, and the database gauges come from the
// outbox.
func TestExporterDedupHits(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByHeader("id")})
	require.NoError(t, err)
	e := newExporter(statsSources{Inbox: ib, Pool: db.Pool, Lanes: 4})

	m := inbox.Message{Topic: "orders", Partition: 0, Offset: 1, Value: []byte("v"), Headers: []outbox.Header{{Key: "id", Value: []byte("o-1")}}}
	for range 3 {
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ib.Process(ctx, tx, m, func(context.Context, pgx.Tx, inbox.Message) error { return nil })
			return err
		}))
	}
	writeRows(t, db, "payments", 0, 2)

	got := gather(t, e)
	require.Equal(t, 1.0, got["pgbox_inbox_processed_total"])
	require.Equal(t, 2.0, got["pgbox_inbox_duplicates_total"])
	require.Equal(t, 1.0, got["pgbox_scrape_database_up"])
	require.Greater(t, got["pgbox_outbox_oldest_unpublished_age_seconds"], 0.0)
	_, hasRelay := got["pgbox_relay_published_total"]
	require.False(t, hasRelay, "no relay in this process: no relay metrics")
}
