package relay

// All of the relay's SQL. Tables are unqualified (search_path). Every time
// comparison uses the database clock.

// lanesStateSQL reads the lane table's shape under a lock that serializes
// relays starting at once.
//
// A live dormant instance (a Fleet's idle target: dormantSQL) holds no
// lane but takes its lanes back when rows come, with its lane count: it
// counts as a live other too.
const lanesStateSQL = `SELECT count(*)::int, coalesce(min(lanes), 0)::int, coalesce(max(lanes), 0)::int,
	(count(*) FILTER (WHERE owner IS NOT NULL AND owner <> $1 AND expires_at > now())
	 + (SELECT count(*) FROM pgbox_relay_instances WHERE instance <> $1 AND expires_at > now() AND sleeping AND NOT kafka_ready))::int
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
// backlog: counting the backlog is a statement of its own (historySQL),
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
// Its last columns count the lanes of another lane count, and all lanes.
// Lanes of another count: another relay reshaped the table while this one
// held none (it was dormant, or paused past its lease), and this one would
// hold nothing while the others leave it its share; the relay stops with
// ErrLaneCountMismatch. No lanes at all (the schema was dropped and
// recreated, the table truncated): the relay creates them again
// (ensureLanes).
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
       (SELECT count(*) FROM live)::int,
       (SELECT count(*) FROM pgbox_relay_lanes WHERE lanes <> $3)::int,
       (SELECT count(*) FROM pgbox_relay_lanes)::int`

// releaseSQL gives up every lane and the instance row on shutdown, so the
// others take over at their next heartbeat instead of after LeaseTTL.
const releaseSQL = `WITH rel AS (
	UPDATE pgbox_relay_lanes SET owner = NULL, expires_at = now() WHERE owner = $1
)
DELETE FROM pgbox_relay_instances WHERE instance = $1`

// claimSQL is the claim: pgbox_outbox_claim2 (migration 00120, its
// statements' cost reduced in 00140) reads, for
// every slot in $3 that belongs to a lane this instance owns right now, the
// slot's oldest unparked rows from its floor ($4, under epoch $5) in id
// order that no parked row holds back: one index range scan of
// pgbox_outbox_claim_idx per slot, positioned at the floor, so its cost
// depends neither on the table, nor on other lanes' backlogs, nor on how
// many deleted rows a held xmin horizon keeps behind the floor (floor.go).
// At most $12 rows come from one slot, so a batch of $13 spans several
// slots when the backlog does.
//
// Before it reads a row it checks what the floors were established under
// ($6, $7: the crash marker, the database, the sequence's file node and
// last value, the server's start) and resets every floor when any changed;
// it lowers floors to the rewinds newer than $8; when any long writer of
// $10 has ended, slots start no later than $9 (the settled bound); with
// $11 every slot is read from its start (the sweep). It takes a lock that
// operator actions on parked rows conflict with, so none commits between
// its reads. See the function's comments in migrations/00120 and 00140,
// and floor.go.
//
// It is a function so that its planner settings travel with it: it plans
// with sequential and bitmap scans off, so no ANALYZE (a bloated heap, an
// emptied heap beside a large index, a burst) flips it off the index.
// Whether a parked row holds a claimed row back is probed
// (pgbox_outbox_parked_key_idx) only while some keyed row is parked.
//
// Its first rows describe the probed slots (id NULL): see claimMeta. The
// claim-wide columns (seq_last to snap) are on the first of them only.
//
// $1 instance, $2 lane count, $3 slots, $4 floors, $5 their epochs, $6 ident,
// $7 highest sequence value seen, $8 newest rewind applied, $9 settled
// bound + 1, $10 long writers, $11 sweep, $12 rows per slot, $13 batch size.
const claimSQL = `SELECT * FROM pgbox_outbox_claim2($1, $2, $3::int[], $4::bigint[], $5::bigint[], $6, $7, $8, $9,
	$10::bigint[], $11, $12, $13)`

// finishSQL records a batch's outcome in one round trip: published rows are
// deleted; rows that failed permanently get attempts + 1 and their error, and
// are parked at MaxAttempts, except rows whose topic does not exist ($6
// true): they are parked once their failures began ($7, UnknownTopicWindow)
// ago. It returns how many rows it deleted, the ids it parked, how many
// failed rows someone else had parked meanwhile, and its own
// transaction id (the floor's rule pairs it with the claim's sequence read:
// floor.go).
//
// Failures are fenced: they only touch rows whose lane still has the epoch
// the rows were claimed under, so an instance that lost the lane meanwhile
// counts no attempt and parks nothing. Deletes are not: a published row's
// record is in Kafka whoever owns its lane now, so deleting it can only
// spare a duplicate (an instance that lost its lane during a slow delete
// still removes what it sent, and the new owner sends again only what it
// claimed before that delete committed).
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
// A failed row that someone parked while the relay was sending it (an
// operator, a script's UPDATE of parked_at) stays parked, with its own
// timestamp and last_error (the failure still counts an attempt): before,
// the failure's CASE, which has no ELSE, unparked it
// (TestAttack160FinishKeepsAParkFromOutside). Only the rows this statement
// parks (parked_at = now(), its transaction's time) are returned as
// parked; the rows parked by someone else are counted apart (they wait
// for an operator, not for a later pass:
// TestAttack160bRowParkedFromOutsideIsNotCountedRetried).
//
// A row is matched by its id and its event id: an id is handed out again
// when the outbox's sequence goes back (TRUNCATE ... RESTART IDENTITY,
// setval lower, a DELETE and RESTART) while a batch is in flight, since
// the writers' trigger moves the sequence forward only to
// pgbox_relay_marker.seq_hw, which trails what the claims saw; a new row
// holding a sent row's id was deleted unsent, lost
// (TestAttack150FinishAfterSequenceResetKeepsNewRows). Pairwise: a new row
// at a sent row's id that carries another sent row's event id (a writer's
// own event ids) is not that row (TestAttackFinishSwappedEventIDsAfterResetKeepNewRows).
// The delete reads the outbox by its primary key (id = ANY) and checks each
// row against a hash of the (id, event id) pairs: `event_id = ANY ($8)`
// as a filter searched the array linearly per row in the generic plan a
// prepared statement keeps, twice the delete's time at 2,000 rows
// (TestAttackFinishGenericPlanUsesPrimaryKey). A NULL event id (only if an
// operator dropped the column's NOT NULL) is read as the nil UUID, as the
// claim reads it, so such a row is still deleted once published and still
// counted and parked when it fails. (A join over the arrays, USING unnest,
// became a hash join over a sequential scan of the outbox when its
// statistics said it was empty.)
//
// $1 published ids, $2 failed ids, $3 their epochs, $4 errors, $5 max attempts,
// $6 failed for a missing topic, $7 unknown-topic window, $8 the published
// rows' event ids, $9 the failed rows' event ids.
const finishSQL = `WITH del AS (
	DELETE FROM pgbox_outbox o WHERE o.id = ANY ($1::bigint[])
	  AND EXISTS (SELECT FROM unnest($1::bigint[], $8::uuid[]) AS d(id, ev)
	              WHERE d.id = o.id AND d.ev = coalesce(o.event_id, '00000000-0000-0000-0000-000000000000'))
	RETURNING o.id
), failed AS (
	UPDATE pgbox_outbox o
	SET attempts = o.attempts + 1, last_error = CASE WHEN o.parked_at IS NULL THEN f.err ELSE o.last_error END,
	    failing_since = coalesce(o.failing_since, now()),
	    parked_at = coalesce(o.parked_at, CASE
	        WHEN f.waits THEN CASE WHEN coalesce(o.failing_since, now()) <= now() - $7::interval THEN now() END
	        WHEN o.attempts + 1 >= $5 THEN now() END)
	FROM unnest($2::bigint[], $3::bigint[], $4::text[], $6::bool[], $9::uuid[]) AS f(id, epoch, err, waits, ev), pgbox_relay_lanes l
	WHERE o.id = f.id AND coalesce(o.event_id, '00000000-0000-0000-0000-000000000000') = f.ev
	  AND l.epoch = f.epoch AND l.lane = o.slot % l.lanes
	RETURNING o.id, o.parked_at = now() AS parked, o.parked_at IS DISTINCT FROM now() AND o.parked_at IS NOT NULL AS held
)
SELECT (SELECT count(*) FROM del)::int, coalesce((SELECT array_agg(id) FROM failed WHERE parked), '{}'),
	(SELECT count(*) FROM failed WHERE held)::int, pg_current_xact_id()::text::bigint, set_config('synchronous_commit', 'off', true)`
