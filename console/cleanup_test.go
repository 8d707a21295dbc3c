package console_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// TestCleanupPageAndRiskWarnings: against the embedded broker, the cleanup
// page shows each topic's rule and why a topic is kept forever, the last
// pass of this process's cleaner and the next; the overview warns about the
// topic kept forever and about keys past their cutoff.
func TestCleanupPageAndRiskWarnings(t *testing.T) {
	t.Parallel()
	kc := kafkatest.New(t)
	addrs := kc.ListenAddrs()
	forever, day, hour := "-1", "86400000", "3600000"
	kafkatest.CreateTopic(t, addrs, "ledger.v1", 1, map[string]*string{"retention.ms": &forever})
	kafkatest.CreateTopic(t, addrs, "orders.v1", 1, map[string]*string{"retention.ms": &hour, "segment.ms": &hour})
	kafkatest.CreateTopic(t, addrs, "payments.v1", 1, map[string]*string{"retention.ms": &day})
	admin, err := sarama.NewClusterAdmin(addrs, kafkatest.Config())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })

	db := testdb.New(t)
	cl, err := cleanup.New(cleanup.Config{Pool: db.Pool, Admin: cleanupsarama.New(admin), DryRun: true, Buffer: cleanup.NoBuffer})
	require.NoError(t, err)
	_, err = cl.RunOnce(context.Background())
	require.NoError(t, err)
	h, err := console.New(console.Config{DB: db.Pool, Auth: testAuth(t), Cleaner: cl, CleanupInterval: time.Hour,
		Inspect: inspect.Config{Cutoffs: &cleanup.CutoffsConfig{Admin: cleanupsarama.New(admin), Buffer: 30 * time.Minute}}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b := &bundle{db: db, srv: srv, h: h}
	exec(t, b.db, `INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at) VALUES
		('svc', 'a', 'ledger.v1', 0, 1, now()),
		('svc', 'b', 'orders.v1', 0, 1, now() - interval '5 hours'),
		('svc', 'c', 'payments.v1', 0, 1, now())`)

	vera := b.as("vera", viewerPass)
	page := vera.get(t, "/cleanup")
	require.Contains(t, page, "infinite_retention")
	require.Contains(t, page, "3600000")
	require.Contains(t, page, "<td>30m0s</td><td>2h30m0s</td>", "orders.v1: buffer, window = 1h + 1h + 30m")
	require.Contains(t, page, "1 ran, 0 skipped")
	// The exact rule per partition: every key waits on the log start (0:
	// nothing deleted yet), the next one at offset 1; payments.v1 keys of
	// unknown position fall back to the time rule, ledger.v1's never.
	require.Contains(t, page, `<td>orders.v1</td><td class="n">0</td><td class="n">0</td><td class="n">0</td>`)
	require.Contains(t, page, "the log start to pass offset 1")
	require.Contains(t, page, "never pruned by time: infinite retention (retention.ms -1)")
	require.Contains(t, page, "time rule: keys are kept 2h30m0s; those from before ")
	require.Contains(t, page, cl.Stats().LastPass.Add(time.Hour).UTC().Format("2006-01-02 15:04:05Z"), "the next pass")
	over := vera.get(t, "/")
	require.Contains(t, over, "topic ledger.v1: 1 keys kept until Kafka&#39;s log start passes them (infinite_retention)")
	require.Contains(t, over, "topic orders.v1: the oldest inbox key is")
	require.NotContains(t, over, "topic payments.v1:")
}
