-- +goose Up
-- A reset sequence is forgotten by every relay, whatever moves it forward.
--
-- The writers' trigger (00120) moves a sequence that went back (setval
-- lower, RESTART, TRUNCATE ... RESTART IDENTITY) forward to
-- pgbox_relay_marker.seq_hw, which trails what the claims read by up to 64
-- and, while a claim that read the sequence is still running, by all it
-- read. So ids a relay already counted as settled can be handed out again:
-- a claim read the sequence at 14,230 before the reset and committed seq_hw
-- after the first writers' trigger had read the old 8,172; those writers
-- took 8,173.. and held them; the next writer moved the sequence past
-- 14,230, so no claim ever read it lower than before. The relay's settled
-- bound from before the reset (8,230) had been held down to seq_hw; once
-- seq_hw rose, its floors passed 8,173.. while those rows were not yet
-- committed, and a key's later row went out before them (make test, stop
-- 51: TestAttack150SequenceResetOverDeadRows/setval; made deterministic by
-- TestSequenceResetUnderALateClaimKeepsFirstRows). The relay had been told
-- not to set the sequence back while relays run: a rule, now enforced.
--
-- Now the trigger counts every move forward, in a sequence of its own
-- (pgbox_outbox_seq_resets: not transactional, so seen by every session
-- at once, before the move), and the claim puts the count in the ident its
-- floors are established under: a claim that reads a new count resets the
-- floors and the relay forgets its settled bound and samples (floor.go).
-- The count is read once more inside the statement that reads the rows,
-- after its snapshot was taken: a writer that moved the sequence and
-- committed before that snapshot was counted before it, so the statement
-- that can see its rows starts every slot at 0 and reads the rows held by
-- the reset's first writers first. The relay's role needs nothing new: the
-- count is read through a SECURITY DEFINER function. Cost: one sequence
-- read per claim statement, twice; nothing for writers, unless the
-- sequence was set back.
--
-- Down restores 00160's claim and 00120's trigger function, and keeps the
-- count and its function (00120's Down drops them): a claim that started
-- with this body while Down commits still finds them (dropped, it failed
-- with "function does not exist", which the relay takes for a schema
-- behind its binary and stops: TestAttack160DownUpUnderRunningRelay). So
-- Up creates them only if they are missing.
CREATE SEQUENCE IF NOT EXISTS pgbox_outbox_seq_resets;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_seq_resets() RETURNS bigint LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
    SELECT coalesce(pg_sequence_last_value('pgbox_outbox_seq_resets'::regclass), 0)
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_xid_first() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
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
            -- Counted first (00170): a claim that reads the moved sequence
            -- then reads the new count.
            PERFORM nextval('pgbox_outbox_seq_resets'::regclass);
            PERFORM setval('pgbox_outbox_id_seq'::regclass, hw);
            v := hw;
        END IF;
    END IF;
    PERFORM set_config('pgbox.outbox_id_seen', v::text, true);
    RETURN NULL;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_claim2(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
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
    v_resets  bigint;
    v_base    text;
BEGIN
    LOCK TABLE pgbox_outbox_rewinds IN SHARE MODE;

    SELECT coalesce(array_agg(g.s ORDER BY g.ord), '{}'), coalesce(array_agg(l.epoch ORDER BY g.ord), '{}'),
           coalesce(array_agg(CASE WHEN l.epoch = g.fe THEN g.f ELSE 0 END ORDER BY g.ord), '{}')
      INTO o_slots, o_epochs, o_floors
      FROM unnest(p_slots, p_floors, p_floor_epochs) WITH ORDINALITY AS g(s, f, fe, ord)
      JOIN pgbox_relay_lanes l ON l.lane = g.s % nullif(p_lanes, 0)
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
    -- The writers' trigger counts each time it moves a reset sequence
    -- forward (pgbox_outbox_seq_resets, below), before it moves it: read
    -- after the sequence, so a claim that read the moved sequence reads
    -- the new count too. A count other than the one the relay's floors
    -- were established under (p_ident) resets them, like the others here.
    IF v_off IS NULL AND NOT has_function_privilege('pgbox_outbox_seq_resets()', 'EXECUTE') THEN
        v_off := 'privilege';
    END IF;
    IF v_off IS NULL THEN
        v_resets := pgbox_outbox_seq_resets();
    END IF;
    v_base := concat_ws(':', v_marker, (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()),
                        pg_relation_filenode(v_seqrel),
                        (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint);
    v_ident := concat_ws(':', v_base, v_resets);
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
    -- a parked row holding it. Asked in the claim's own statement (pk), so
    -- in the snapshot its rows are read in: see 00160's header.
    --
    -- The count of sequence resets is read again here (rs), after this
    -- statement's snapshot was taken (00170's header): if a writer's
    -- trigger moved a reset sequence forward since the read above, every
    -- slot starts at 0 in this very statement, which reads every row that
    -- snapshot holds, in id order; the relay forgets its floors (the new
    -- count is in ident) and takes no sample from this claim (seq_last
    -- NULL: its sequence read may be from before the reset).
    RETURN QUERY
    WITH sn AS MATERIALIZED (
        SELECT pg_current_snapshot() AS s
    ), rs AS MATERIALIZED (
        SELECT x.n, x.n IS DISTINCT FROM v_resets AS moved
          FROM (SELECT CASE WHEN v_off IS NULL THEN pgbox_outbox_seq_resets() END AS n) x
    ), pk AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL) AS any
    ), ended AS MATERIALIZED (
        SELECT coalesce(bool_or(pg_visible_in_snapshot(w::text::xid8, sn.s)), false) AS e
          FROM sn LEFT JOIN unnest(p_writers) AS w ON true
    ), st AS MATERIALIZED (
        SELECT u.s, u.e, u.ord, CASE WHEN rs.moved THEN 0 WHEN ended.e THEN least(u.f, p_settled) ELSE u.f END AS f
          FROM unnest(o_slots, o_epochs, o_floors) WITH ORDINALITY AS u(s, e, f, ord), ended, rs
    )
    (SELECT NULL::bigint, NULL::uuid, st.s::smallint, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb,
            NULL::timestamptz, NULL::int, st.e, st.f,
            CASE WHEN st.ord = 1 AND NOT rs.moved THEN v_seq END, CASE WHEN st.ord = 1 THEN v_hw END,
            CASE WHEN st.ord = 1 THEN v_off END,
            CASE WHEN st.ord = 1 THEN concat_ws(':', v_base, rs.n) END,
            CASE WHEN st.ord = 1 THEN v_reset OR rs.moved END, CASE WHEN st.ord = 1 THEN v_rewind END,
            CASE WHEN st.ord = 1 THEN v_rwslots END, CASE WHEN st.ord = 1 THEN v_rwfrom END,
            CASE WHEN st.ord = 1 THEN ended.e END, CASE WHEN st.ord = 1 THEN sn.s::text END
       FROM st, ended, sn, rs ORDER BY st.ord)
    UNION ALL
    (SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts, st.e,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::boolean, NULL::bigint,
            NULL::int[], NULL::bigint[], NULL::boolean, NULL::text
       FROM st, pk
      CROSS JOIN LATERAL (
            SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
              FROM pgbox_outbox c
             WHERE (c.slot, c.id) >= (st.s::smallint, CASE WHEN p_sweep THEN 0 ELSE st.f END) AND c.slot <= st.s
               AND c.parked_at IS NULL
               AND (NOT pk.any OR c.key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM pgbox_outbox p
                     WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
                       AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id))
             ORDER BY c.slot, c.id
             LIMIT p_per_slot) c
      LIMIT p_batch);
END
$fn$;
-- +goose StatementEnd

-- The functions read their objects through the schema this migration runs
-- in (as 00160 pinned the trigger functions).
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_outbox_xid_first() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_seq_resets() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_claim2(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
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
BEGIN
    LOCK TABLE pgbox_outbox_rewinds IN SHARE MODE;

    SELECT coalesce(array_agg(g.s ORDER BY g.ord), '{}'), coalesce(array_agg(l.epoch ORDER BY g.ord), '{}'),
           coalesce(array_agg(CASE WHEN l.epoch = g.fe THEN g.f ELSE 0 END ORDER BY g.ord), '{}')
      INTO o_slots, o_epochs, o_floors
      FROM unnest(p_slots, p_floors, p_floor_epochs) WITH ORDINALITY AS g(s, f, fe, ord)
      JOIN pgbox_relay_lanes l ON l.lane = g.s % nullif(p_lanes, 0)
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
    -- a parked row holding it. Asked in the claim's own statement (pk), so
    -- in the snapshot its rows are read in: see the header.
    RETURN QUERY
    WITH sn AS MATERIALIZED (
        SELECT pg_current_snapshot() AS s
    ), pk AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL) AS any
    ), ended AS MATERIALIZED (
        SELECT coalesce(bool_or(pg_visible_in_snapshot(w::text::xid8, sn.s)), false) AS e
          FROM sn LEFT JOIN unnest(p_writers) AS w ON true
    ), st AS MATERIALIZED (
        SELECT u.s, u.e, u.ord, CASE WHEN ended.e THEN least(u.f, p_settled) ELSE u.f END AS f
          FROM unnest(o_slots, o_epochs, o_floors) WITH ORDINALITY AS u(s, e, f, ord), ended
    )
    (SELECT NULL::bigint, NULL::uuid, st.s::smallint, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb,
            NULL::timestamptz, NULL::int, st.e, st.f,
            CASE WHEN st.ord = 1 THEN v_seq END, CASE WHEN st.ord = 1 THEN v_hw END,
            CASE WHEN st.ord = 1 THEN v_off END, CASE WHEN st.ord = 1 THEN v_ident END,
            CASE WHEN st.ord = 1 THEN v_reset END, CASE WHEN st.ord = 1 THEN v_rewind END,
            CASE WHEN st.ord = 1 THEN v_rwslots END, CASE WHEN st.ord = 1 THEN v_rwfrom END,
            CASE WHEN st.ord = 1 THEN ended.e END, CASE WHEN st.ord = 1 THEN sn.s::text END
       FROM st, ended, sn ORDER BY st.ord)
    UNION ALL
    (SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts, st.e,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::boolean, NULL::bigint,
            NULL::int[], NULL::bigint[], NULL::boolean, NULL::text
       FROM st, pk
      CROSS JOIN LATERAL (
            SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
              FROM pgbox_outbox c
             WHERE (c.slot, c.id) >= (st.s::smallint, CASE WHEN p_sweep THEN 0 ELSE st.f END) AND c.slot <= st.s
               AND c.parked_at IS NULL
               AND (NOT pk.any OR c.key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM pgbox_outbox p
                     WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
                       AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id))
             ORDER BY c.slot, c.id
             LIMIT p_per_slot) c
      LIMIT p_batch);
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_xid_first() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
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

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_outbox_xid_first() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd
