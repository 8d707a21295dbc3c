-- +goose Up
-- A row parked by anyone but the relay could let a later row of its key
-- out first. The claim (pgbox_outbox_claim2, 00140) asked whether any
-- keyed row is parked (v_parked) in a statement of its own, before the
-- statement that reads the rows to claim; under READ COMMITTED each
-- statement of a function reads its own snapshot. A row parked, and a
-- later row of its key committed, between the two (an INSERT that sets
-- parked_at, an UPDATE of parked_at from outside the relay, a trigger, a
-- script) left v_parked false for a claim that did not see the earlier row
-- any more (it is parked) and saw the later one: the later row was
-- published while the earlier one waited (the review of 00150 built it:
-- one run in 16 for rows inserted parked, one in 3 for an UPDATE every 50
-- ms). The relay's own parking and operators' retries and discards were
-- not affected (the relay parks in its finish; the others share a lock
-- with the claim).
--
-- Now the question is asked inside the statement that claims (a
-- materialized CTE), so in the same snapshot as the rows: a row parked
-- before that snapshot is seen parked by both, a row parked after it is
-- claimed and published before any later row of its key. The same for
-- pgbox_outbox_below_floor (00120), the sweep's look, where the stale
-- answer could only call a sweep for nothing, and for pgbox_outbox_claim
-- (00100), which the previous release's relays call during an upgrade
-- (the review of 00160). Same work per call: one probe of the parked
-- rows, as before. And the trigger functions' search_path is pinned to
-- the migration's schema (below). Down restores 00140's claim, 00120's
-- below_floor and 00100's claim.
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
CREATE OR REPLACE FUNCTION pgbox_outbox_below_floor(p_slots int[], p_floors bigint[]) RETURNS int[]
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
DECLARE
    v_out    int[];
BEGIN
    SELECT coalesce(array_agg(u.s ORDER BY u.s), '{}') INTO v_out
      FROM unnest(p_slots, p_floors) AS u(s, f),
           (SELECT EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL) AS any) pk
     WHERE u.f > 0 AND EXISTS (
           SELECT 1 FROM pgbox_outbox c
            WHERE (c.slot, c.id) >= (u.s::smallint, 0) AND (c.slot, c.id) < (u.s::smallint, u.f)
              AND c.parked_at IS NULL
              AND (NOT pk.any OR c.key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM pgbox_outbox p
                    WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL
                      AND p.topic = c.topic AND sha256(p.key) = sha256(c.key) AND p.key = c.key AND p.id < c.id)));
    RETURN v_out;
END
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_claim(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
                                   p_floor_epochs bigint[], p_per_slot int, p_batch int)
RETURNS TABLE (id bigint, event_id uuid, slot smallint, topic text, key bytea, value bytea, headers jsonb,
               created_at timestamptz, attempts int, epoch bigint, floor bigint,
               seq_last bigint, snap_xmin bigint, db_started bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
DECLARE
    o_slots  int[];
    o_epochs bigint[];
    o_floors bigint[];
    v_seq    bigint;
    rw       record;
    i        int;
BEGIN
    SELECT coalesce(array_agg(g.s ORDER BY g.ord), '{}'), coalesce(array_agg(l.epoch ORDER BY g.ord), '{}'),
           coalesce(array_agg(CASE WHEN l.epoch = g.fe THEN g.f ELSE 0 END ORDER BY g.ord), '{}')
      INTO o_slots, o_epochs, o_floors
      FROM unnest(p_slots, p_floors, p_floor_epochs) WITH ORDINALITY AS g(s, f, fe, ord)
      JOIN pgbox_relay_lanes l ON l.lane = g.s % l.lanes
     WHERE l.owner = p_instance AND l.expires_at > now() AND l.lanes = p_lanes;

    IF EXISTS (SELECT 1 FROM pgbox_outbox_rewinds) THEN
        FOR rw IN WITH d AS (DELETE FROM pgbox_outbox_rewinds r WHERE r.slot = ANY (o_slots) RETURNING r.slot, r.from_id)
                  SELECT d.slot, min(d.from_id) AS from_id FROM d GROUP BY d.slot LOOP
            i := array_position(o_slots, rw.slot::int);
            o_floors[i] := least(o_floors[i], rw.from_id);
        END LOOP;
    END IF;

    -- Every row with an id up to v_seq got its transaction id before this
    -- read (outbox.Write takes the transaction id first), so below the
    -- transaction id of any statement that starts after this one: the
    -- relay pairs v_seq with its next finish statement's (relay/floor.go).
    SELECT CASE WHEN s.seqcache = 1 AND has_sequence_privilege(s.seqrelid, 'SELECT, USAGE')
                THEN pg_sequence_last_value(s.seqrelid) END INTO v_seq
      FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence('pgbox_outbox', 'id')::regclass;

    -- Only when a keyed row is parked does a claimed row need the probe for
    -- a parked row holding it: asked in the claiming statement (pk), in its
    -- snapshot (00160).
    RETURN QUERY
    WITH pk AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL) AS any
    )
    (SELECT NULL::bigint, NULL::uuid, u.s::smallint, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb,
            NULL::timestamptz, NULL::int, u.e, u.f, v_seq,
            pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
            (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint
       FROM unnest(o_slots, o_epochs, o_floors) AS u(s, e, f))
    UNION ALL
    (SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts, s.e,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
       FROM pk, unnest(o_slots, o_epochs, o_floors) WITH ORDINALITY AS s(s, e, f, ord)
      CROSS JOIN LATERAL (
            SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
              FROM pgbox_outbox c
             WHERE (c.slot, c.id) >= (s.s::smallint, s.f) AND c.slot <= s.s
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

-- The writers' and the rewinds' trigger functions (00120) read their
-- tables through the search_path they were created with, stored as written
-- (SET search_path FROM CURRENT, or none for pgbox_outbox_rewind): a
-- migration run with PostgreSQL's default path stored "$user", public, and
-- once a schema named after the calling role held pgbox tables too, every
-- INSERT into this schema's outbox took its ids from that schema's
-- sequence, and a retry's rewind went to that schema's table; the rewind
-- function, with no setting at all, wrote to whatever the session's path
-- named (an UPDATE of another_schema.pgbox_outbox from a session set to
-- this one). Pinned to the schema this migration runs in, where 00002 and
-- 00120 created the tables (the reviews of 00160).
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_outbox_xid_first() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_fill_slot() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_rewind() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down
-- The trigger functions keep their pinned search_path: it names the
-- schema their tables are in, which is what 00120 meant them to read.
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
    v_parked  boolean;
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_below_floor(p_slots int[], p_floors bigint[]) RETURNS int[]
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_claim(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
                                   p_floor_epochs bigint[], p_per_slot int, p_batch int)
RETURNS TABLE (id bigint, event_id uuid, slot smallint, topic text, key bytea, value bytea, headers jsonb,
               created_at timestamptz, attempts int, epoch bigint, floor bigint,
               seq_last bigint, snap_xmin bigint, db_started bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
DECLARE
    o_slots  int[];
    o_epochs bigint[];
    o_floors bigint[];
    v_seq    bigint;
    v_parked boolean;
    rw       record;
    i        int;
BEGIN
    SELECT coalesce(array_agg(g.s ORDER BY g.ord), '{}'), coalesce(array_agg(l.epoch ORDER BY g.ord), '{}'),
           coalesce(array_agg(CASE WHEN l.epoch = g.fe THEN g.f ELSE 0 END ORDER BY g.ord), '{}')
      INTO o_slots, o_epochs, o_floors
      FROM unnest(p_slots, p_floors, p_floor_epochs) WITH ORDINALITY AS g(s, f, fe, ord)
      JOIN pgbox_relay_lanes l ON l.lane = g.s % l.lanes
     WHERE l.owner = p_instance AND l.expires_at > now() AND l.lanes = p_lanes;

    IF EXISTS (SELECT 1 FROM pgbox_outbox_rewinds) THEN
        FOR rw IN WITH d AS (DELETE FROM pgbox_outbox_rewinds r WHERE r.slot = ANY (o_slots) RETURNING r.slot, r.from_id)
                  SELECT d.slot, min(d.from_id) AS from_id FROM d GROUP BY d.slot LOOP
            i := array_position(o_slots, rw.slot::int);
            o_floors[i] := least(o_floors[i], rw.from_id);
        END LOOP;
    END IF;

    -- Every row with an id up to v_seq got its transaction id before this
    -- read (outbox.Write takes the transaction id first), so below the
    -- transaction id of any statement that starts after this one: the
    -- relay pairs v_seq with its next finish statement's (relay/floor.go).
    SELECT CASE WHEN s.seqcache = 1 AND has_sequence_privilege(s.seqrelid, 'SELECT, USAGE')
                THEN pg_sequence_last_value(s.seqrelid) END INTO v_seq
      FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence('pgbox_outbox', 'id')::regclass;

    -- Only when a keyed row is parked does a claimed row need the probe for
    -- a parked row holding it.
    v_parked := EXISTS (SELECT 1 FROM pgbox_outbox p WHERE p.parked_at IS NOT NULL AND p.key IS NOT NULL);

    RETURN QUERY
    (SELECT NULL::bigint, NULL::uuid, u.s::smallint, NULL::text, NULL::bytea, NULL::bytea, NULL::jsonb,
            NULL::timestamptz, NULL::int, u.e, u.f, v_seq,
            pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
            (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint
       FROM unnest(o_slots, o_epochs, o_floors) AS u(s, e, f))
    UNION ALL
    (SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts, s.e,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
       FROM unnest(o_slots, o_epochs, o_floors) WITH ORDINALITY AS s(s, e, f, ord)
      CROSS JOIN LATERAL (
            SELECT c.id, c.event_id, c.slot, c.topic, c.key, c.value, c.headers, c.created_at, c.attempts
              FROM pgbox_outbox c
             WHERE (c.slot, c.id) >= (s.s::smallint, s.f) AND c.slot <= s.s
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
