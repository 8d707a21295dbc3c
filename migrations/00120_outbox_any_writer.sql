-- +goose Up
-- The floor fails safe (docs/relay.md, "The floor"): what makes the relay's
-- floor correct is enforced here, in the database, for every writer, not
-- by a rule writers must remember.
--
-- 1. Any writer takes its transaction id before its rows take ids.
--
-- The floor's rule needs every row's transaction to have its transaction
-- id before the row takes its id from the outbox sequence. A row's id is
-- computed with its values (COPY buffers rows it has read before it writes
-- them; an INSERT ... SELECT whose values are slow to compute holds ids
-- long before it writes anything), but a transaction gets its id only at
-- its first write. This statement-level BEFORE INSERT trigger runs before
-- any row of the statement is read or computed (for INSERT, INSERT ...
-- SELECT, MERGE and COPY alike, from a trigger on a business table too)
-- and takes the transaction id. ENABLE ALWAYS: it fires even under
-- session_replication_role = replica (logical replication, some restore
-- tools). Its cost is one function call per statement, not per row.
--
-- It also notes, for the statement, the sequence's last value: every id
-- the statement's rows take by default is above it, so a row that comes
-- with an id at or below it got that id before the statement started
-- (SELECT nextval first and INSERT ... OVERRIDING SYSTEM VALUE later, as
-- JPA/Hibernate sequence ids do; COPY with an id column, which PostgreSQL
-- accepts for an identity column) and may lie below the relay's floors:
-- the row trigger below gives it a fresh id, taken after the transaction
-- id. SECURITY DEFINER: writers need no grant on the sequence (an identity
-- column never asked them for one).
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_xid_first() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
DECLARE
    v  bigint;
    hw bigint;
BEGIN
    PERFORM pg_current_xact_id();
    v := coalesce(pg_sequence_last_value('pgbox_outbox_id_seq'::regclass), 0);
    -- The sequence went back (setval, RESTART, TRUNCATE ... RESTART
    -- IDENTITY, a restore) below what a relay has seen and may have let
    -- its floors pass (pgbox_relay_marker.seq_hw): forward again before
    -- this statement takes an id, so no id is handed out twice below the
    -- floors, however soon the writers pass the old value. Serialized, so
    -- two statements cannot set it back after each other's ids.
    SELECT m.seq_hw INTO hw FROM pgbox_relay_marker m;
    IF v < hw THEN
        PERFORM pg_advisory_xact_lock('pgbox_outbox_id_seq'::regclass::oid::int, 120);
        v := coalesce(pg_sequence_last_value('pgbox_outbox_id_seq'::regclass), 0);
        IF v < hw THEN
            PERFORM setval('pgbox_outbox_id_seq'::regclass, hw);
            v := hw;
        END IF;
    END IF;
    PERFORM set_config('pgbox.outbox_id_seen', v::text, true);
    RETURN NULL;
END
$fn$;
-- +goose StatementEnd
CREATE TRIGGER pgbox_outbox_xid_first BEFORE INSERT ON pgbox_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION pgbox_outbox_xid_first();
ALTER TABLE pgbox_outbox ENABLE ALWAYS TRIGGER pgbox_outbox_xid_first;

-- 1b. A plain INSERT from any language needs only topic, key and value.
--
-- outbox.Write computes a row's slot (fnv1a32(key) % 256, internal/slot:
-- every row of one key in one slot, so one lane, so in order) and its
-- event id (a UUIDv7). A writer in another language, psql or a trigger on
-- a business table may leave both out: event_id defaults to a UUIDv7 made
-- here, and a row trigger fills in a missing slot with the same formula
-- (its WHEN clause costs writers that give a slot nothing measurable), and
-- gives a fresh id to a row that came with one taken before its statement.
-- docs/outbox-sql.md shows the INSERT and an example trigger.
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_slot(p_key bytea, p_event_id uuid) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    b bytea  := coalesce(p_key, substring(uuid_send(p_event_id) FROM 9 FOR 8)); -- keyless: the id's random half
    h bigint := 2166136261;                                                      -- FNV-1a, 32 bits
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN (h % 256)::smallint;
END
$fn$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_event_id() RETURNS uuid LANGUAGE sql VOLATILE AS $fn$
    -- A UUIDv7: 48 bits of Unix milliseconds, version 7, the rest random.
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
               PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$fn$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_fill_slot() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
BEGIN
    IF NEW.id <= nullif(current_setting('pgbox.outbox_id_seen', true), '')::bigint THEN
        NEW.id := nextval('pgbox_outbox_id_seq'::regclass); -- an id taken before the statement (above)
    END IF;
    IF NEW.slot IS NULL THEN
        NEW.slot := pgbox_outbox_slot(NEW.key, NEW.event_id);
    END IF;
    RETURN NEW;
END
$fn$;
-- +goose StatementEnd
ALTER TABLE pgbox_outbox ALTER COLUMN event_id SET DEFAULT pgbox_outbox_event_id();
CREATE TRIGGER pgbox_outbox_fill_slot BEFORE INSERT ON pgbox_outbox
    FOR EACH ROW WHEN (NEW.slot IS NULL OR NEW.id <= nullif(current_setting('pgbox.outbox_id_seen', true), '')::bigint)
    EXECUTE FUNCTION pgbox_outbox_fill_slot();
ALTER TABLE pgbox_outbox ENABLE ALWAYS TRIGGER pgbox_outbox_fill_slot;

-- 2. A marker that crash recovery erases.
--
-- After one backend crashes (the OOM killer, a SIGKILL) the postmaster
-- resets and replays WAL without restarting (pg_postmaster_start_time does
-- not change), and sequence values and transaction ids whose WAL was never
-- flushed are handed out again. Crash recovery, a promotion and a restored
-- base backup all empty UNLOGGED tables: the claim writes a random token
-- here when the table is empty, and a relay that finds a token other than
-- the one its floors were established under forgets them. One row.
CREATE UNLOGGED TABLE pgbox_relay_marker (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    token      uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- A sequence value relays have seen (claims raise it, at most 64 ids
    -- behind the newest they read, and cap their floors at it): the
    -- statement trigger above never lets the sequence hand out ids at or
    -- below it again.
    seq_hw     bigint      NOT NULL DEFAULT 0
);

-- 3. Rewinds are read, not consumed, so operator actions and claims can
-- share one lock (pgbox_outbox_claim2 below). A relay remembers the newest
-- rewind it applied; operator actions delete rewinds older than an hour.
--
-- And they are written by the database: a parked row unparked or deleted
-- by any statement (relay parked retry|discard, the console, a
-- hand-written UPDATE in psql, an older release's binary) records its
-- rewind here, in its own transaction, so the rows it held are claimed
-- again. The WHEN clauses cost the relay's own deletes and parking
-- nothing measurable (they never match them).
CREATE INDEX pgbox_outbox_rewinds_created_idx ON pgbox_outbox_rewinds (created_at);
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_rewind() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO pgbox_outbox_rewinds (slot, from_id) VALUES (OLD.slot, OLD.id);
    RETURN NULL;
END
$fn$;
-- +goose StatementEnd
CREATE TRIGGER pgbox_outbox_rewind_unparked AFTER UPDATE OF parked_at ON pgbox_outbox
    FOR EACH ROW WHEN (OLD.parked_at IS NOT NULL AND NEW.parked_at IS NULL) EXECUTE FUNCTION pgbox_outbox_rewind();
CREATE TRIGGER pgbox_outbox_rewind_deleted AFTER DELETE ON pgbox_outbox
    FOR EACH ROW WHEN (OLD.parked_at IS NOT NULL) EXECUTE FUNCTION pgbox_outbox_rewind();
ALTER TABLE pgbox_outbox ENABLE ALWAYS TRIGGER pgbox_outbox_rewind_unparked;
ALTER TABLE pgbox_outbox ENABLE ALWAYS TRIGGER pgbox_outbox_rewind_deleted;

-- pgbox_outbox_claim2 is the relay's claim from this release on
-- (pgbox_outbox_claim, 00100, stays for the previous release's relays
-- during a rolling upgrade). Planner settings as 00100's, for the same
-- reasons.
--
-- What it adds to 00100's claim:
--
--   * It takes SHARE on pgbox_outbox_rewinds first. A statement that
--     unparks or deletes a parked row writes a rewind in its transaction
--     (the triggers above: ROW EXCLUSIVE on the rewinds, held to its
--     commit), so a retry or discard commits either before the claim
--     starts or after it ends: never between the claim's reads of rewinds,
--     parked rows and rows, each of which has its own snapshot under READ
--     COMMITTED.
--   * The server, database and sequence it reads: the crash marker's
--     token, the database's oid, the sequence's file node (RESTART and
--     TRUNCATE ... RESTART IDENTITY give it a new one) and the server's
--     start time form ident. When ident differs from p_ident, when the
--     sequence reads lower than p_seq_seen (setval, a restore) or when the
--     floor cannot be used (seq_off: 'cache' when the sequence hands out
--     values per session, 'privilege' when the relay may not read it,
--     'marker' when it may not write the marker), every floor is reset to
--     0 in this very claim, before any row is read.
--   * Rewinds newer than p_rewind_seen lower the floors of the probed
--     slots; all of them are returned (rw_slots, rw_from) so the relay
--     lowers its other floors too.
--   * Long writers: p_writers are the transactions the relay's floors
--     passed while they ran (they may still write rows below the floors).
--     If any of them has ended in the snapshot the rows are read with,
--     each slot starts no later than p_settled (below which no row can
--     still appear): one rescan, in the same statement that sees the
--     writer's rows, so they come out in id order with the rows after.
--   * p_sweep: every slot is read from its start (the relay's second line
--     of defence, once pgbox_outbox_below_floor below found a row under a
--     floor); floor still reports where the claim would have started.
--
-- Result: first one row per probed slot (id NULL) with its epoch and the
-- floor as above, the sequence's last value (NULL when off), why the floor
-- is off, ident, whether floors were reset, the newest rewind id, the
-- rewinds, whether the claim rescanned and the rows' snapshot
-- (pg_snapshot text); then the rows, as 00100's.
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_claim2(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
                                    p_floor_epochs bigint[], p_ident text, p_seq_seen bigint,
                                    p_rewind_seen bigint, p_settled bigint, p_writers bigint[],
                                    p_sweep boolean, p_per_slot int, p_batch int)
RETURNS TABLE (id bigint, event_id uuid, slot smallint, topic text, key bytea, value bytea, headers jsonb,
               created_at timestamptz, attempts int, epoch bigint, floor bigint,
               seq_last bigint, seq_hw bigint, seq_off text, ident text, reset boolean, rewind_seen bigint,
               rw_slots int[], rw_from bigint[], rescan boolean, snap text)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
DECLARE
    o_slots   int[];
    o_epochs  bigint[];
    o_floors  bigint[];
    v_seqrel  regclass;
    v_seq     bigint;
    v_hw      bigint;
    v_off     text;
    v_marker  uuid;
    v_ident   text;
    v_reset   boolean;
    v_rewind  bigint;
    v_rwslots int[];
    v_rwfrom  bigint[];
    v_parked  boolean;
BEGIN
    LOCK TABLE pgbox_outbox_rewinds IN SHARE MODE;

    SELECT coalesce(array_agg(g.s ORDER BY g.ord), '{}'), coalesce(array_agg(l.epoch ORDER BY g.ord), '{}'),
           coalesce(array_agg(CASE WHEN l.epoch = g.fe THEN g.f ELSE 0 END ORDER BY g.ord), '{}')
      INTO o_slots, o_epochs, o_floors
      FROM unnest(p_slots, p_floors, p_floor_epochs) WITH ORDINALITY AS g(s, f, fe, ord)
      JOIN pgbox_relay_lanes l ON l.lane = g.s % l.lanes
     WHERE l.owner = p_instance AND l.expires_at > now() AND l.lanes = p_lanes;

    -- The sequence (pgbox_outbox_id_seq, the id's identity sequence; grant
    -- the relay's role SELECT on it): every row with an id up to v_seq had its transaction
    -- id before this read (the trigger above), so below the transaction id
    -- of any statement that starts after it (relay/floor.go).
    v_seqrel := pg_get_serial_sequence('pgbox_outbox', 'id')::regclass;
    SELECT CASE WHEN s.seqcache <> 1 THEN 'cache'
                WHEN NOT has_sequence_privilege(s.seqrelid, 'SELECT, USAGE') THEN 'privilege' END
      INTO v_off FROM pg_sequence s WHERE s.seqrelid = v_seqrel;
    IF v_off IS NULL THEN
        -- NULL: nothing handed out yet (a fresh schema, or setval(..., false)).
        v_seq := coalesce(pg_sequence_last_value(v_seqrel), 0);
    END IF;

    -- The rule's premise is the trigger above: disabled (ALTER TABLE ...
    -- DISABLE TRIGGER [ALL], as pg_restore --disable-triggers does), or
    -- enabled for origin sessions only, a writer's ids may come before
    -- its transaction id: floors off ('trigger') while it is so. Enabling
    -- it again waits for every writer that started without it (the lock
    -- ALTER TABLE takes conflicts with theirs).
    IF v_off IS NULL AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = 'pgbox_outbox'::regclass
                                        AND t.tgname = 'pgbox_outbox_xid_first' AND t.tgenabled = 'A') THEN
        v_off := 'trigger';
    END IF;

    -- A role granted ON ALL TABLES before this migration created the
    -- marker may not read it: floors off ('marker'), never a failed claim.
    IF NOT (has_table_privilege('pgbox_relay_marker', 'SELECT') AND has_table_privilege('pgbox_relay_marker', 'INSERT')
            AND has_table_privilege('pgbox_relay_marker', 'UPDATE')) THEN
        v_off := coalesce(v_off, 'marker');
    ELSE
        SELECT m.token INTO v_marker FROM pgbox_relay_marker m;
        IF v_marker IS NULL THEN
            BEGIN
                INSERT INTO pgbox_relay_marker DEFAULT VALUES ON CONFLICT DO NOTHING;
                SELECT m.token INTO v_marker FROM pgbox_relay_marker m;
            EXCEPTION WHEN insufficient_privilege THEN
                v_off := coalesce(v_off, 'marker');
            END;
        END IF;
    END IF;
    v_ident := concat_ws(':', v_marker, (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()),
                         pg_relation_filenode(v_seqrel),
                         (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint);
    v_reset := v_off IS NOT NULL OR p_ident IS DISTINCT FROM v_ident OR v_seq < p_seq_seen;
    IF v_off IS NULL THEN
        -- What this claim saw of the sequence, for the writers' trigger;
        -- floors stay at or below it (seq_hw).
        UPDATE pgbox_relay_marker m SET seq_hw = v_seq WHERE m.seq_hw < v_seq - 64;
        SELECT m.seq_hw INTO v_hw FROM pgbox_relay_marker m;
    END IF;
    IF v_reset THEN
        o_floors := array_fill(0::bigint, ARRAY[cardinality(o_slots)]);
    END IF;

    SELECT coalesce(array_agg(r.slot::int ORDER BY r.slot), '{}'), coalesce(array_agg(r.from_id ORDER BY r.slot), '{}'),
           greatest(p_rewind_seen, max(r.top))
      INTO v_rwslots, v_rwfrom, v_rewind
      FROM (SELECT w.slot, min(w.from_id) AS from_id, max(w.id) AS top
              FROM pgbox_outbox_rewinds w WHERE w.id > p_rewind_seen GROUP BY w.slot) r;
    IF cardinality(v_rwslots) > 0 THEN
        SELECT coalesce(array_agg(least(u.f, coalesce(r.from_id, u.f)) ORDER BY u.ord), '{}') INTO o_floors
          FROM unnest(o_slots, o_floors) WITH ORDINALITY AS u(s, f, ord)
          LEFT JOIN unnest(v_rwslots, v_rwfrom) AS r(s, from_id) ON r.s = u.s;
    END IF;

    -- Only when a keyed row is parked does a claimed row need the probe for
    -- a parked row holding it.
    v_parked := EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL);

    RETURN QUERY
    WITH sn AS MATERIALIZED (
        SELECT pg_current_snapshot() AS s
    ), ended AS MATERIALIZED (
        SELECT coalesce(bool_or(pg_visible_in_snapshot(w::text::xid8, sn.s)), false) AS e
          FROM sn LEFT JOIN unnest(p_writers) AS w ON true
    ), st AS MATERIALIZED (
        SELECT u.s, u.e, u.ord, CASE WHEN ended.e THEN least(u.f, p_settled) ELSE u.f END AS f
          FROM unnest(o_slots, o_epochs, o_floors) WITH ORDINALITY AS u(s, e, f, ord), ended
    )
    (SELECT NULL::bigint, NULL::uuid, st.s::smallint, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb,
            NULL::timestamptz, NULL::int, st.e, st.f, v_seq, v_hw, v_off, v_ident, v_reset, v_rewind,
            v_rwslots, v_rwfrom, ended.e, sn.s::text
       FROM st, ended, sn ORDER BY st.ord)
    UNION ALL
    (SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts, st.e,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::boolean, NULL::bigint,
            NULL::int[], NULL::bigint[], NULL::boolean, NULL::text
       FROM st
      CROSS JOIN LATERAL (
            SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
              FROM pgbox_outbox c
             WHERE (c.slot, c.id) >= (st.s::smallint, CASE WHEN p_sweep THEN 0 ELSE st.f END) AND c.slot <= st.s
               AND c.parked_at IS NULL
               AND (NOT v_parked OR c.key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM pgbox_outbox p
                     WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
                       AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id))
             ORDER BY c.slot, c.id
             LIMIT p_per_slot) c
      LIMIT p_batch);
END
$fn$;
-- +goose StatementEnd

-- pgbox_outbox_below_floor is the sweep's look, off the claim's path (the
-- relay runs it on its own connection every SweepInterval): the slots
-- among p_slots with a committed, unparked row below their floor
-- (p_floors) that no parked row holds back. Only when it names one does
-- the relay's next claim read every slot from its start (p_sweep). Planner
-- settings as the claim's: one index range scan per slot below its floor.
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_below_floor(p_slots int[], p_floors bigint[]) RETURNS int[]
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
DECLARE
    v_parked boolean := EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL);
    v_out    int[];
BEGIN
    SELECT coalesce(array_agg(u.s ORDER BY u.s), '{}') INTO v_out
      FROM unnest(p_slots, p_floors) AS u(s, f)
     WHERE u.f > 0 AND EXISTS (
           SELECT 1 FROM pgbox_outbox c
            WHERE (c.slot, c.id) >= (u.s::smallint, 0) AND (c.slot, c.id) < (u.s::smallint, u.f)
              AND c.parked_at IS NULL
              AND (NOT v_parked OR c.key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM pgbox_outbox p
                    WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
                      AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id)));
    RETURN v_out;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgbox_outbox_below_floor(int[], bigint[]);
DROP TRIGGER pgbox_outbox_rewind_unparked ON pgbox_outbox;
DROP TRIGGER pgbox_outbox_rewind_deleted ON pgbox_outbox;
DROP FUNCTION pgbox_outbox_rewind();
DROP FUNCTION pgbox_outbox_claim2(text, int, int[], bigint[], bigint[], text, bigint, bigint, bigint, bigint[],
                                  boolean, int, int);
DROP INDEX pgbox_outbox_rewinds_created_idx;
-- What 00170's Down keeps (see there); the trigger goes with the table.
DROP SEQUENCE IF EXISTS pgbox_relay_seq_hw;
DROP TABLE pgbox_relay_marker;
DROP FUNCTION IF EXISTS pgbox_relay_marker_hw();
DROP TRIGGER pgbox_outbox_fill_slot ON pgbox_outbox;
DROP FUNCTION pgbox_outbox_fill_slot();
ALTER TABLE pgbox_outbox ALTER COLUMN event_id DROP DEFAULT;
DROP FUNCTION pgbox_outbox_event_id();
DROP FUNCTION pgbox_outbox_slot(bytea, uuid);
DROP TRIGGER pgbox_outbox_xid_first ON pgbox_outbox;
DROP FUNCTION pgbox_outbox_xid_first();
