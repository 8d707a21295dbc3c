package inboxsarama_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxsarama"
	"github.com/pgbox/pgbox/inbox/internal/consumetest"
	"github.com/pgbox/pgbox/internal/testutil"
)

// newWatermarkInbox returns an inbox in watermark mode, with keyed dedup on
// key too when key is given.
func newWatermarkInbox(t testing.TB, consumer string, key ...inbox.KeyStrategy) *inbox.Inbox {
	t.Helper()
	cfg := inbox.Config{Consumer: consumer, Dedup: inbox.DedupWatermark}
	if len(key) > 0 {
		cfg.Dedup, cfg.Key = inbox.DedupWatermarkAndKeys, key[0]
	}
	ib, err := inbox.New(cfg)
	require.NoError(t, err)
	return ib
}

// records returns the business rows and the distinct records among them.
func records(t testing.TB, b *cgBundle) (rows, distinct int) {
	t.Helper()
	require.NoError(t, b.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (topic, partition, "offset")) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

// Members join and leave one group (partitions move between them, and the
// new owner re-reads what the old one processed but never committed to
// Kafka): in watermark mode every record has exactly one business row,
// with one state row per partition and nothing in pgbox_inbox. With event-id
// keys added, a fifth of the records resend an earlier event, and every
// event has exactly one business row.
func TestConsumerWatermarkRebalances(t *testing.T) {
	t.Parallel()
	for _, withKeys := range []bool{false, true} {
		name := "watermark"
		if withKeys {
			name = "watermark+keys"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := cgSetup(t, 4)
			msgs, unique := consumetest.Resends(b.Topic, "ev", 6000, rand.New(rand.NewPCG(3, 4)))
			ib := newWatermarkInbox(t, "svc")
			if withKeys {
				ib = newWatermarkInbox(t, "svc", inbox.ByHeader(eventHeader))
			}
			var handlers []*inboxsarama.Handler
			// The first two members never commit offsets to Kafka (as if each
			// crashed after its transactions): whoever takes their
			// partitions over reads everything they processed again.
			join := func(batch int, commits bool) *member {
				h := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: batch, RetryBackoff: 10 * time.Millisecond}})
				handlers = append(handlers, h)
				cfg := cgConfig()
				cfg.Consumer.Offsets.AutoCommit.Enable = commits
				return startMemberConfig(t, cfg, b.Addrs, "svc", []string{b.Topic}, h)
			}
			chunk := func(i int) { b.Produce(t, msgs[i*1000:(i+1)*1000]...) }
			// A twin group with the same inbox consumer reads every record
			// too, concurrently: each record is delivered twice at about the
			// same time, the race of a partition handed over while its old
			// owner's transaction is in flight.
			twin := mustHandler(t, b.DB.Pool, ib, effect, inboxsarama.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: 10}})
			handlers = append(handlers, twin)
			tm := startMember(t, b.Addrs, "svc-twin", []string{b.Topic}, twin)
			a := join(50, false)
			chunk(0)
			chunk(1)
			bm := join(1, false)
			chunk(2)
			a.stop()
			cm := join(20, true)
			chunk(3)
			chunk(4)
			bm.stop()
			chunk(5)
			want := len(msgs)
			if withKeys {
				want = unique
			}
			testutil.Eventually(t, 90*time.Second, "every record processed", func() bool {
				_, distinct := b.Effects(t)
				return distinct == unique
			})
			testutil.Eventually(t, 30*time.Second, "every record committed", func() bool {
				n := 0
				for p := range int32(4) {
					n += int(b.Committed(t, "svc", p))
				}
				return n == len(msgs)
			})
			cm.stop()
			testutil.Eventually(t, 30*time.Second, "the twin group done", func() bool {
				st := twin.Stats()
				return st.Processed+st.Duplicates >= uint64(len(msgs))
			})
			tm.stop()

			rows, distinct := b.Effects(t)
			require.Equal(t, unique, distinct)
			if !withKeys {
				rows, distinct = records(t, b)
				require.Equal(t, len(msgs), distinct)
			}
			require.Equal(t, want, rows, "no record (event) has two business rows")
			var processed, dups uint64
			for _, h := range handlers {
				processed += h.Stats().Processed
				dups += h.Stats().Duplicates
			}
			require.EqualValues(t, want, processed)
			require.GreaterOrEqual(t, processed+dups, uint64(2*len(msgs)), "every record was delivered at least twice")
			t.Logf("%d records, %d processed, %d duplicates (redeliveries after rebalances, resends)", len(msgs), processed, dups)
			require.Equal(t, 4, b.Count(t, `SELECT count(*) FROM pgbox_inbox_watermark`))
			if withKeys {
				require.Equal(t, unique, b.Count(t, `SELECT count(*) FROM pgbox_inbox`))
			} else {
				require.Zero(t, b.Count(t, `SELECT count(*) FROM pgbox_inbox`))
			}
		})
	}
}
