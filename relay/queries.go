package relay

// All of the relay's SQL. Tables are unqualified (search_path). Every time
// comparison uses the database clock.

// lanesStateSQL reads the lane table's shape under a lock that serializes
// relays starting at once.
const lanesStateSQL = `SELECT count(*)::int, coalesce(min(lanes), 0)::int, coalesce(max(lanes), 0)::int,
	count(*) FILTER (WHERE owner IS NOT NULL AND owner <> $1 AND expires_at > now())::int
FROM pgbox_relay_lanes`

const lockLanesSQL = `LOCK TABLE pgbox_relay_lanes IN SHARE ROW EXCLUSIVE MODE`

const resetLanesSQL = `DELETE FROM pgbox_relay_lanes`

const createLanesSQL = `INSERT INTO pgbox_relay_lanes (lane, lanes) SELECT g, $1 FROM generate_series(0, $1 - 1) g`

// heartbeatSQL is the instance's periodic lease statement: it renews the
// instance row, computes this instance's share of the lanes (the live
// instances sorted by name; instance #rank of n gets lane % n = rank),
// releases owned lanes outside that share, renews or takes the lanes inside
// it that are free, expired or already its own (a new owner gets a new
// epoch) and prunes long-dead instance rows. It stays cheap whatever the
// backlog: counting the backlog is a statement of its own (backlogSQL),
// which took seconds on a loaded server with 200k rows waiting and must not
// delay a lease renewal.
//
// A released lane stays unclaimable for a grace period ($5, one heartbeat
// interval): the releasing instance no longer claims from it, but its
// in-flight batch can still finish and delete its rows (the epoch is
// unchanged), so a rebalance does not normally cause duplicates.
//
// An instance that has not reached Kafka since it started (kafka_ready
// false, $5) is registered (so status shows it running) but left out of the
// ranking: it takes no lanes, and the others keep theirs. $6 says Kafka is
// unreachable now: kafka_down_since keeps the start of the outage.
//
// $1 instance, $2 lease TTL, $3 lane count, $4 release grace, $5 Kafka
// reached since start, $6 Kafka unreachable now.
const heartbeatSQL = `WITH me AS (
	INSERT INTO pgbox_relay_instances (instance, expires_at, kafka_ready, kafka_down_since)
	VALUES ($1, now() + $2::interval, $5, CASE WHEN $6 THEN now() END)
	ON CONFLICT (instance) DO UPDATE SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at, kafka_ready = $5,
		kafka_down_since = CASE WHEN $6 THEN coalesce(pgbox_relay_instances.kafka_down_since, now()) END
	RETURNING instance, kafka_ready
), live AS (
	SELECT instance FROM pgbox_relay_instances WHERE expires_at > now() AND instance <> $1 AND kafka_ready
	UNION ALL
	SELECT instance FROM me WHERE kafka_ready
), ranked AS (
	SELECT instance, (row_number() OVER (ORDER BY instance))::int - 1 AS rank, (count(*) OVER ())::int AS n FROM live
), target AS (
	SELECT l.lane FROM pgbox_relay_lanes l JOIN ranked r ON r.instance = $1
	WHERE l.lanes = $3 AND l.lane % r.n = r.rank
), released AS (
	UPDATE pgbox_relay_lanes SET owner = NULL, expires_at = now() + $4::interval
	WHERE owner = $1 AND lane NOT IN (SELECT lane FROM target)
	RETURNING lane
), held AS (
	UPDATE pgbox_relay_lanes l SET owner = $1, expires_at = now() + $2::interval,
		epoch = CASE WHEN l.owner = $1 AND l.expires_at > now() THEN l.epoch ELSE nextval('pgbox_relay_epoch') END
	WHERE l.lane IN (SELECT lane FROM target)
	  AND (l.owner = $1 OR l.expires_at <= now()) -- free lanes and released ones past their grace have expired too
	RETURNING l.lane
), gone AS (
	DELETE FROM pgbox_relay_instances WHERE expires_at < now() - interval '1 hour'
)
SELECT (SELECT count(*) FROM held)::int,
       (SELECT count(*) FROM released)::int,
       (SELECT count(*) FROM live)::int`

// backlogSQL counts unpublished, unparked rows, up to $1 (backlogCap).
const backlogSQL = `SELECT count(*) FROM (SELECT 1 FROM pgbox_outbox WHERE parked_at IS NULL LIMIT $1) b`

// releaseSQL gives up every lane and the instance row on shutdown, so the
// others take over at their next heartbeat instead of after LeaseTTL.
const releaseSQL = `WITH rel AS (
	UPDATE pgbox_relay_lanes SET owner = NULL, expires_at = now() WHERE owner = $1
)
DELETE FROM pgbox_relay_instances WHERE instance = $1`

// claimSQL reads, for every slot in $4 that belongs to a lane this instance
// owns right now, the slot's oldest unparked rows in id order that no parked
// row holds back (heldBySQL): one index range scan per slot
// (pgbox_outbox_claim_idx), so its cost does not grow with the table or with
// other lanes' backlogs. $4 lists the slots in the order to visit them: all
// of them, rotated each pass so a busy slot cannot starve the others, or
// just the ones notifications named. No cursor: a row whose transaction
// committed late with a lower id is simply found on the next pass (the
// sequence-gap race cannot skip it), because rows leave the table only once
// published.
//
// At most $5 rows come from one slot, so a batch spans several slots when
// the backlog does.
//
// Every claim starts at each slot's first row: a claim that skipped rows
// below an id (rows in flight, say) would also skip a row of another key
// that committed late with a lower id, and then take that key's next row
// above the bound: an order inversion (the chaos harness found one). So a
// claim runs only once the previous batch's rows are deleted.
//
// The slot is matched as a row comparison, (slot, id) > (s, 0) AND
// slot <= s, not as slot = s: with the equality, when a few
// hot keys fill the table (so slot statistics are skewed), the planner
// prefers the primary key in id order and filters on slot, which walks the
// whole table for every empty slot (seconds per claim on 200k rows). Only
// pgbox_outbox_claim_idx can answer the row comparison in (slot, id)
// order, and it positions the scan at (s, 0) directly.
//
// $1 instance, $2 batch size, $3 lane count, $4 slots, $5 rows per slot.
const claimSQL = `SELECT o.id, o.event_id, o.slot, o.topic, o.key, o.value, o.headers, o.created_at, o.attempts, s.epoch
FROM (
	SELECT g.slot, l.epoch
	FROM unnest($4::int[]) WITH ORDINALITY AS g(slot, ord)
	JOIN pgbox_relay_lanes l ON l.lane = g.slot % l.lanes
	WHERE l.owner = $1 AND l.expires_at > now() AND l.lanes = $3
	ORDER BY g.ord
) s
CROSS JOIN LATERAL (
	SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
	FROM pgbox_outbox c
	WHERE (c.slot, c.id) > (s.slot::smallint, 0) AND c.slot <= s.slot
	  AND c.parked_at IS NULL
	  AND NOT EXISTS (` + heldBySQL + `)
	ORDER BY c.slot, c.id
	LIMIT $5
) o
LIMIT $2`

// heldBySQL finds a parked row that holds row c back: an earlier row of
// c's topic and key (rows without a key hold nothing and are never held).
// One probe of pgbox_outbox_parked_key_idx, which holds parked rows only.
// "Same key" is the order domain of Kafka's per-key order: the topic and the
// key bytes (send.go's keyOf).
const heldBySQL = `SELECT 1 FROM pgbox_outbox p
		WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
		  AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id`

// finishSQL records a batch's outcome in one round trip: published rows are
// deleted; rows that failed permanently get attempts + 1 and their error, and
// are parked at MaxAttempts, except rows whose topic does not exist ($7
// true): they are parked once their failures began ($8, UnknownTopicWindow)
// ago. Both are fenced: they only touch rows whose lane
// still has the epoch the rows were claimed under, so an instance that lost
// the lane meanwhile changes nothing.
//
// The statement commits asynchronously (synchronous_commit off for its own
// transaction only): the relay does not wait for the WAL flush, and neither
// do the writers' commits queue behind it. A database crash can lose the
// last few hundred milliseconds of these deletes; their rows are then
// published again, with the same event ids, in order, which is the
// at-least-once promise (a relay killed between send and delete does the
// same). Writers' transactions are not affected: an outbox row is as durable
// as the business write it commits with.
//
// $1 published ids, $2 their epochs, $3 failed ids, $4 their epochs, $5 errors, $6 max attempts,
// $7 failed for a missing topic, $8 unknown-topic window.
const finishSQL = `WITH del AS (
	DELETE FROM pgbox_outbox o
	USING unnest($1::bigint[], $2::bigint[]) AS d(id, epoch), pgbox_relay_lanes l
	WHERE o.id = d.id AND l.epoch = d.epoch AND l.lane = o.slot % l.lanes
	RETURNING o.id
), failed AS (
	UPDATE pgbox_outbox o
	SET attempts = o.attempts + 1, last_error = f.err, failing_since = coalesce(o.failing_since, now()),
	    parked_at = CASE
	        WHEN f.waits THEN CASE WHEN coalesce(o.failing_since, now()) <= now() - $8::interval THEN now() END
	        WHEN o.attempts + 1 >= $6 THEN now() END
	FROM unnest($3::bigint[], $4::bigint[], $5::text[], $7::bool[]) AS f(id, epoch, err, waits), pgbox_relay_lanes l
	WHERE o.id = f.id AND l.epoch = f.epoch AND l.lane = o.slot % l.lanes
	RETURNING o.parked_at IS NOT NULL AS parked
)
SELECT (SELECT count(*) FROM del)::int, (SELECT count(*) FROM failed WHERE parked)::int,
	set_config('synchronous_commit', 'off', true)`
