-- +goose Up
-- What pgbox_outbox_claim2 (migration 00120) costs per call, with the same
-- rows claimed: make bench-against COMMIT=43fe993 measured this release's
-- drain at 0.74-0.93x v0.1.0's, and a claim of every slot cost ~0.3-0.5 ms
-- more than it needs to before reading any row (relay/claim.go,
-- CHANGELOG.md). Two changes to the statements, none to what they read or
-- decide:
--
--   * The owned slots: the lane join's condition was l.lane = g.s %
--     l.lanes, a join filter evaluated for every (slot, lane) pair (256 x
--     16 a claim). The WHERE clause keeps only lanes with l.lanes =
--     p_lanes, so on every joined row g.s % l.lanes = g.s % p_lanes: the
--     same pairs, with a condition on the slot side alone. nullif: a
--     p_lanes of 0 matched no lane (lanes >= 1 by its CHECK) and must not
--     divide by zero now.
--   * The slot rows: the claim-wide columns (seq_last, seq_hw, seq_off,
--     ident, reset, rewind_seen, rw_slots, rw_from, rescan, snap) were
--     repeated on every slot row, identical (they are the function's
--     variables and the one-row CTEs ended and sn), 256 times a claim:
--     38 KB of a claim's result that holds no row. They are now on the
--     first slot row only (ord 1, which ORDER BY st.ord returns first) and
--     NULL on the others; the relay reads them from the first slot row
--     (relay.claim), as it read the same values before.
--
-- Every other statement is 00120's, in the same order. Down restores
-- 00120's body.
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
