package consume_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pgbox/pgbox/inbox"
)

// BenchmarkConsumerBatchHandler: records consumed per second through each
// adapter with a batch handler (ConsumerConfig.BatchHandler, batches of
// 100, the batch's business rows in one INSERT … SELECT FROM unnest),
// against hand-written consumers on the same client, measured as
// BenchmarkConsumer measures (interleaved run by run, a fresh group per
// run, the clock from the group's creation to every business row in the
// table and the group's committed offsets at the end of every partition;
// rt/msg counted by a tracer on the consumers' pool). The rows:
//
//   - <client>/handwritten/batch100: the hand-written batched loop with its
//     own dedup (the keys seen = ANY, the new ones inserted) and one
//     business INSERT per new message: what exactly-once costs a team by
//     hand. The batch handler's target: ≥ 1.5×.
//   - <client>/nodedup-batchwrite/batch100: a hand-written loop that writes
//     the batch's rows in one statement and dedups nothing (BEGIN; the
//     INSERT … unnest; COMMIT): the price of exactly-once at batch 100.
//     Target: ≥ 0.9×.
//   - <client>/handwritten-batchwrite/batch100: the hand-written dedup with
//     the batch's rows in one statement.
//   - <client>/watermark-vs-nodedup-batchwrite/batch100: pgbox's side in
//     DedupWatermark mode (one watermark row per partition moved per batch,
//     instead of a pgbox_inbox row per message with its four indexes)
//     against the loop that dedups nothing. Watermark mode dedups
//     redeliveries only, not a producer's duplicates at other offsets.
//
// PGBOX_BENCH_DELAY puts a delaying proxy in front of PostgreSQL (make
// bench-remote); rt/msg is what the delay multiplies.
//
//	make bench-remote PKG=./inbox/internal/consume BENCH=ConsumerBatchHandler BENCHTIME=3x
func BenchmarkConsumerBatchHandler(b *testing.B) {
	env := newBenchEnv(b)
	for _, client := range []string{"sarama", "franz"} {
		for _, row := range []struct{ pg, vs string }{
			{"pgbox-batch", "handwritten"}, {"pgbox-batch", "nodedup-batchwrite"}, {"pgbox-batch", "handwritten-batchwrite"},
			{"pgbox-batch-watermark", "nodedup-batchwrite"},
		} {
			name := row.vs
			if row.pg == "pgbox-batch-watermark" {
				name = "watermark-vs-" + row.vs
			}
			b.Run(fmt.Sprintf("%s/%s/batch100", client, name), func(b *testing.B) {
				env.interleave(b, client, row.pg, row.vs, 100)
			})
		}
	}
}

// isPgbox reports whether kind is one of pgbox's sides: "pgbox" (the
// per-message handler), "pgbox-batch" (the batch handler) or
// "pgbox-batch-watermark" (the batch handler with DedupWatermark).
func isPgbox(kind string) bool { return strings.HasPrefix(kind, "pgbox") }

// pgboxSide is the inbox, handler and settings of pgbox's side of kind in
// group, with batches of batch.
func pgboxSide(kind, group string, batch int) (inbox.Config, inbox.HandlerFunc, inbox.ConsumerConfig) {
	icfg := inbox.Config{Consumer: group, Key: inbox.ByHeader(eventHeader)}
	switch kind {
	case "pgbox-batch-watermark":
		icfg = inbox.Config{Consumer: group, Dedup: inbox.DedupWatermark}
		fallthrough
	case "pgbox-batch":
		return icfg, nil, inbox.ConsumerConfig{BatchSize: batch, BatchHandler: batchEffect}
	}
	return icfg, benchEffect, inbox.ConsumerConfig{BatchSize: batch}
}
