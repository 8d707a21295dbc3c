// Package relay publishes committed outbox rows (see package outbox) to Kafka
// with an idempotent sarama producer, and deletes them once Kafka has
// acknowledged them. Run one or more instances, usually as cmd/pgbox-relay:
//
//	r, err := relay.New(relay.Config{Pool: pool, Brokers: []string{"kafka:9092"}})
//	err = r.Run(ctx) // until ctx is canceled
//
// # Guarantees
//
// Every committed row is published at least once; rows of rolled-back
// transactions never exist. Rows with the same key reach Kafka on one
// partition (while the topic's partition count stays the same) in id order, which is commit order for writers that serialize on
// the business row before writing the event (see package outbox). Every
// record carries the row's event id in the "pgbox-event-id" header
// (EventIDHeader) and its creation time in "pgbox-created-at"; consumers dedupe
// on the event id (inbox.ByHeader(relay.EventIDHeader)).
//
// # Order and scale: slots, lanes, leases
//
// outbox.Write stores slot = fnv1a32(key) % 256 in each row. The relay groups
// slots into Config.Lanes lanes (lane = slot % Lanes). A lane is owned by one
// instance at a time through a lease row in pgbox_relay_lanes; instances
// announce themselves in pgbox_relay_instances. Every HeartbeatInterval (2 s)
// each instance runs one statement that renews its instance row and its
// leases, computes its share (the live instances sorted by name; instance
// number i of n gets the lanes with lane % n = i), releases lanes outside its
// share and takes free or expired lanes inside it. So lanes rebalance as
// instances come and go, and a dead instance's lanes are taken over within
// LeaseTTL + HeartbeatInterval (8 s by default). All lease times use the
// database's clock.
//
// Lease rows rather than session advisory locks: they work through pgbouncer
// in transaction mode (an advisory lock lives in a server session the pooler
// hands to others), they are visible (SELECT * FROM pgbox_relay_lanes), and a
// lease can be fenced with an epoch. Behind pgbouncer in transaction mode,
// set NoListen (LISTEN needs a session) or give the relay a direct
// connection; everything else works unchanged.
//
// # The sequence-gap race
//
// The relay keeps no cursor. Each pass reads, for every slot it owns, the
// slot's oldest unpublished rows in id order, publishes them and deletes
// them. A transaction that took a lower id but commits after higher ids were
// published is simply found by the next pass: nothing trusts id > last_seen.
// With one owner per lane and rows leaving the table only once published,
// there is nothing to skip.
//
// # One record in flight per key
//
// One SendMessages call cannot promise that a failed record is not overtaken
// by a later record of the same partition: sarama fails a message whose
// leader it cannot find at that moment and goes on with the next, which may
// succeed once the broker is back. So the relay sends through a sarama
// AsyncProducer with at most one record in flight per (topic, key): a key's
// next row goes out when the previous one is acknowledged, and once a row
// fails the rest of its key waits for the next pass. Different keys run
// concurrently, so the producer still batches; a hot key costs one produce
// round trip per row (the price of strict order: about a third of the
// unordered baseline's rate when all traffic is on 10 keys). Claims take at
// most 16 rows per slot so that a batch spans many slots and keys. Under a
// backlog the work overlaps: the next batch is claimed while the current one
// is sent, and a sent batch is deleted in the background while the next goes
// out.
//
// # Fencing and the duplicate window
//
// A lane's epoch changes whenever it changes owner. The delete (and the park)
// after a send name the epoch the rows were claimed under, so an instance
// that lost a lane while paused, partitioned or slow changes nothing. The
// duplicate window: records an instance sent but could not delete before the
// lane moved (it was killed, paused or cut off after the broker acknowledged
// them, or its delete failed) are sent again by the next owner, with the same
// event id. That is at most two batches of the instance that lost the lane:
// the one it was sending and the previous one, whose delete runs in the
// background while the next batch is claimed and sent. An instance also
// stops sending rows it claimed before its leases could have lapsed (no
// heartbeat for LeaseTTL, measured on the monotonic clock, so a paused
// process notices) or before it handed lanes over: those rows stay for the
// lanes' current owners. A graceful hand-over (rebalance, shutdown) makes none: a released
// lane stays unclaimable for one heartbeat interval so the releasing instance
// can finish its batch, and Run releases its lanes only after finishing it.
//
// # Failures
//
// Broker unreachable, leader moving, timeouts: the pass backs off (capped
// exponential, MaxBackoff) and retries; nothing is marked. A row that fails
// permanently (unknown topic with auto-creation off, larger than the
// producer or broker allows, invalid record, not authorized) gets attempts +
// 1 and last_error; at MaxAttempts (5) it is parked (parked_at set) and the
// relay stops trying it. Until then, later rows of the same key wait behind
// it, in order; once it is parked they proceed. That is the documented choice:
// a permanent failure is a property of the row or its topic, not something
// time fixes, and holding a key's later events forever would stall the
// business process behind it; the parked row stays in the table with its
// error for an operator, who can fix the cause and replay it with
// UPDATE pgbox_outbox SET parked_at = NULL, attempts = 0 WHERE id = ...
// (it then publishes after the key's newer events).
//
// # Wake-up and idle cost
//
// An idle instance sends 1.5 statements per second: one claim per
// PollInterval (1 s) and one heartbeat per HeartbeatInterval (2 s). It also
// LISTENs on outbox.ChannelDefault on a dedicated connection: writers with
// outbox.Config{Notify: true} wake it at commit, and any number of
// notifications coalesce into one pending wake-up. A notification names the
// slots written, so a woken relay probes just those (and the slots its last
// batch found rows in) instead of all its slots; every poll probes them all,
// so rows written without a notification are found within PollInterval. After a pass that found
// rows it drains again at once, and for two seconds polls every
// BusyPollInterval (25 ms), so steady traffic flows without NOTIFY too.
// Correctness never depends on notifications.
//
// # Stop
//
// When ctx is canceled, Run sends nothing more, waits at most StopTimeout
// for the records in flight, deletes what Kafka acknowledged, releases its
// lanes and returns nil. Records still unanswered after StopTimeout are given
// up on: their rows stay and the next owner sends them (a duplicate if the
// broker took them after all, with the same event id).
//
// # Partitioning
//
// Config.Partitioner defaults to NewMurmur2Partitioner, the Java client's
// placement (toPositive(murmur2(key)) % partitions), so a key lands on the
// partition Java, franz-go and Kafka Streams producers choose for it.
// sarama.NewHashPartitioner (FNV-1a, sarama's default) is the alternative
// when sarama producers already write the topic.
//
// # The claim query on a large table
//
// The partial index pgbox_outbox_claim_idx (slot, id) WHERE parked_at IS NULL
// gives one short index range scan per owned slot. On 10M rows (1% parked,
// an instance owning 4 of 16 lanes, PostgreSQL 15), a claim of 1,024 rows:
//
//	Limit (actual time=0.086..2.788 rows=1024 loops=1)
//	  ->  Nested Loop (actual time=0.085..2.731 rows=1024 loops=1)
//	        ->  Sort (actual time=0.043..0.055 rows=64 loops=1)
//	              Sort Key: ((((g.slot + 256) - 0) % 256))
//	              ->  Nested Loop (actual time=0.013..0.029 rows=64 loops=1)
//	                    ->  Seq Scan on pgbox_relay_lanes l (actual time=0.006..0.008 rows=4 loops=1)
//	                          Filter: ((owner = 'me'::text) AND (lanes = 16) AND (expires_at > now()))
//	                    ->  Function Scan on generate_series g (actual time=0.002..0.003 rows=16 loops=4)
//	        ->  Limit (actual time=0.019..0.040 rows=16 loops=64)
//	              ->  Index Scan using pgbox_outbox_claim_idx on pgbox_outbox (actual time=0.018..0.039 rows=16 loops=64)
//	                    Index Cond: (slot = g.slot)
//	Execution Time: 2.856 ms
//
// TestClaimQueryUsesIndex asserts this plan shape on every run.
//
// # Stats and logs
//
// Stats returns counters for an exporter: published, retried, parked,
// batches, batch latency (last, max, total), backlog (table-wide, from the
// heartbeat) and lanes held. Logs go to Config.Logger (slog, snake_case keys);
// a canceled context is not logged as an error.
package relay
