// Package relay publishes committed outbox rows (see package outbox) to Kafka
// as an idempotent producer (its own, over sarama's client: see "Many records
// per key in flight" below), and deletes them once Kafka has
// acknowledged them. Run one or more instances ([New], [Relay.Run]), usually
// as the binary cmd/relay:
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
// ([EventIDHeader]) and its creation time in "pgbox-created-at"; consumers dedupe
// on the event id (inbox.ByHeader(relay.EventIDHeader)).
//
// # Order and scale: slots, lanes, leases
//
// outbox.Write stores slot = fnv1a32(key) % 256 in each row. The relay groups
// slots into [Config.Lanes] lanes (lane = slot % Lanes; [LanesDefault] 16). A lane is owned by one
// instance at a time through a lease row in pgbox_relay_lanes; instances
// announce themselves in pgbox_relay_instances. Every [Config.HeartbeatInterval] (2 s)
// each instance runs one statement that renews its instance row and its
// leases, computes its share (the live instances sorted by name; instance
// number i of n gets the lanes with lane % n = i), releases lanes outside its
// share and takes free or expired lanes inside it. So lanes rebalance as
// instances come and go, and a dead instance's lanes are taken over within
// [Config.LeaseTTL] + HeartbeatInterval (8 s by default). All lease times use the
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
// # Many records per key in flight, order kept
//
// The relay does not use sarama's AsyncProducer to send: that producer fails
// a record whose partition leader it cannot find at that moment (or whose
// retries ran out) and goes on with the next record of the partition, which
// may succeed, so a key's later record could overtake a failed earlier one.
// Instead it writes record batches itself, as an idempotent producer (a
// producer id from InitProducerID and per-partition sequence numbers), over
// sarama's client and wire types. A pass's rows are grouped by partition
// (all rows of a key share one) in id order and cut into record batches of
// up to Producer.MaxMessageBytes; each round sends at most one batch per
// partition, in one request per leader broker (which, in a Fleet, also
// carries the other targets' batches waiting for that broker; a batch
// whose partition another target's batch already fills goes in the next
// request). Kafka writes a batch whole
// or not at all, and the next batch of a partition is built only after the
// previous one was answered, so a failure cuts a partition cleanly:
// everything before it is written, nothing after it was sent.
//
// A batch that fails with a retriable error (leader missing or moved,
// timeout, broken connection) is sent again as the same batch with the same
// sequence, so the broker drops it if the first try was written (no
// duplicate), up to Producer.Retry.Max times after Producer.Retry.Backoff;
// then its rows wait for the next pass, with the rest of that partition.
// A batch the broker rejects as such (too large for the broker, invalid
// record, policy) is sent again one row per batch, so only the bad row
// fails. After any failed batch the producer takes a new producer id, so no
// sequence gap is left behind. So a hot key costs no round trip per record:
// a whole batch of it goes in one request. Under a backlog the steps
// overlap: the next batch is claimed while the current one is sent, and a
// sent batch is deleted in the background while the next goes out.
//
// Of [Config.Kafka] the relay uses the client settings (Version, Net,
// Metadata, ClientID) and, of Producer: RequiredAcks, Timeout (the
// broker's wait for acks), Retry.Max and Retry.Backoff, Compression and
// CompressionLevel, MaxMessageBytes (the largest record batch) and
// Partitioner. Settings of sarama's own AsyncProducer (Idempotent, Return,
// Flush, ChannelBufferSize, Interceptors) do not apply, and New accepts any
// value of them; it refuses RequiredAcks other than WaitForAll (a row is
// deleted once its record is acknowledged) and a Version before 0.11.0.0
// (record batches with producer ids).
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
// background while the next batch is claimed and sent. A batch retried
// within one send is not a duplicate: the broker recognizes its sequence. An instance also
// stops sending rows it claimed before its leases could have lapsed (no
// heartbeat for LeaseTTL, measured on the monotonic clock, so a paused
// process notices) or before it handed lanes over: those rows stay for the
// lanes' current owners. A graceful hand-over (rebalance, shutdown) makes none: a released
// lane stays unclaimable for one heartbeat interval so the releasing instance
// can finish its batch, and Run releases its lanes only after finishing it.
//
// # Failures
//
// Broker unreachable, leader moving, timeouts: after the producer's own
// retries, the pass backs off (capped exponential, MaxBackoff) and retries;
// nothing is marked. The instance registers in pgbox_relay_instances before
// Kafka first answers (taking no lanes until it does, so the instances that
// can publish keep theirs), records an outage in kafka_down_since (`relay
// status`: "running, Kafka unreachable since …") and logs it at ERROR once
// it has lasted [Config.KafkaOutageAlert] (1 minute). A row that fails permanently (larger than the producer
// or broker allows, invalid record, not authorized) gets attempts + 1 and
// last_error; at [Config.MaxAttempts] (5) it is parked (parked_at set) and the relay
// stops trying it. A topic that does not exist (auto-creation off; a
// dead-letter topic too) is retried with backoff for [Config.UnknownTopicWindow]
// ([UnknownTopicWindowDefault], 5 minutes) from the row's first such failure before the row is parked: a
// deploy often writes before its topic is created.
//
// A failing or parked row holds its key: later rows of the same topic and
// key (the order domain; rows without a key hold nothing) are not claimed
// while an earlier row of that key is parked, so a key's order is never
// broken, and other keys go on. The parked row stays in the table with its
// error for an operator, who fixes the cause and then either retries it
// (`relay parked retry`, inspect.RetryParked: the relay publishes it, then
// the rows it held, in id order) or discards it (`relay parked discard`,
// inspect.DiscardParked: the held rows go on). `relay status` shows how
// many rows each parked row holds back. Held rows are read past by every
// claim of their slot (one index probe each), so a key held for long with a
// large backlog behind it slows its slot's claims: act on parked rows.
//
// # Wake-up and idle cost
//
// After a pass that found rows the relay drains again at once, and for two
// seconds after the last such pass it watches the table every
// BusyPollInterval (2 ms): one index range scan over the newest ids, which
// names the slots of new rows, so steady traffic is published within
// milliseconds without any help from the writers. The watch reads from a
// floor that lags the newest id seen by 200-400 ms, so a transaction that
// took its id before a later one but committed after it is still seen.
//
// Then it sleeps: it sets the sleeping flag of its row in
// pgbox_relay_instances, probes every slot once more, and waits. A sleeping
// instance sends 1.5 statements per second: one claim per PollInterval (1 s)
// and one heartbeat per HeartbeatInterval (2 s). It LISTENs on
// outbox.ChannelDefault on a dedicated connection, and writers with
// outbox.Config{Notify: true} send a NOTIFY only while some live instance
// sleeps: a NOTIFY serializes the commits of every notifying transaction in
// the cluster, so writers pay that only when traffic resumes after a pause.
// Any number of notifications coalesce into one pending wake-up; a
// notification names the slots written, so a woken relay probes just those.
// Every poll probes every slot, so rows nobody named (a transaction that ran
// longer than the watch's lag, a writer without Notify while the relay
// sleeps) are found within PollInterval. Correctness never depends on
// notifications or the watch.
//
// # Stop
//
// When ctx is canceled, [Relay.Run] sends nothing more, waits at most [Config.StopTimeout]
// for the records in flight, deletes what Kafka acknowledged, releases its
// lanes and returns nil. Every Kafka call on the relay's path honours ctx
// (sarama's calls take none: they run in a goroutine Run stops waiting
// for, and closing the client ends them), so a broker that accepts
// connections and never answers, at start-up or mid-send, does not hold
// Run past StopTimeout. Records still unanswered after StopTimeout are given
// up on: their rows stay and the next owner sends them (a duplicate if the
// broker took them after all, with the same event id).
//
// # Partitioning
//
// [Config.Partitioner] defaults to [NewMurmur2Partitioner], the Java client's
// placement (toPositive(murmur2(key)) % partitions), so a key lands on the
// partition Java, franz-go and Kafka Streams producers choose for it.
// sarama.NewHashPartitioner (FNV-1a, sarama's default) is the alternative
// when sarama producers already write the topic.
//
// # The claim on a large table, and under a held xmin horizon
//
// The partial index pgbox_outbox_claim_idx (slot, id) WHERE parked_at IS NULL
// gives one short index range scan per owned slot, from the slot's floor
// (floor.go): every row below it is published, parked or held by a parked
// row, and the floor passes an id only once no transaction that could commit
// a row below it is running, or the relay watches it (a long writer: one
// rescan when it ends). The database makes every writer, whatever its
// language, take its transaction id before its rows take ids; a crash
// recovery, a promotion or a sequence that went back resets the floors at
// the next claim; and a sweep every Config.SweepInterval reads every slot
// from its start, so a hole in the rule is a delay and an ERROR, never a
// loss. So a claim's cost depends neither on the table size nor on how many
// deleted rows a held xmin horizon (a pg_dump, a long report) keeps behind
// the floor. The claim is the function pgbox_outbox_claim2 (migrations
// 00120 and 00140), which plans with sequential and bitmap scans off, so
// no ANALYZE flips it off the index. Each probe, with
// some row parked (300k rows, a third parked):
//
//	->  Limit
//	      ->  Index Scan using pgbox_outbox_claim_idx on pgbox_outbox c
//	            Index Cond: ((ROW(slot, id) >= ROW((st_1.s)::smallint, st_1.f)) AND (slot <= st_1.s))
//	            Filter: ((key IS NULL) OR (NOT (SubPlan 1)))
//	            SubPlan 1
//	              ->  Index Scan using pgbox_outbox_parked_key_idx on pgbox_outbox p
//
// The subplan is the parking rule (a parked row holds its key): one probe
// per candidate row into pgbox_outbox_parked_key_idx, an index of the parked
// rows only, and only while some keyed row is parked.
//
// TestClaimQueryUsesIndex (300k rows, a third parked), TestClaimPlanCannotFlip
// (the states that flipped the plan) and TestFloorHeldHorizon assert this on
// every run.
//
// # Stats and logs
//
// [Relay.Stats] returns counters for an exporter: published, retried, parked,
// batches, batch latency (last, max, total), backlog (table-wide, counted
// at every fifth heartbeat) and lanes held. Logs go to Config.Logger (slog, snake_case keys);
// a canceled context is not logged as an error. [Config.PublishHook] (an outbox.PublishHook), if set,
// is told about each published batch: pgboxotel.Tracer implements it to
// trace the publish (the relay imports no tracing library).
package relay
