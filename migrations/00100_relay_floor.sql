-- +goose Up
-- The relay's claim starts each slot at a remembered floor instead of the
-- slot's first index entry, so the entries of rows it deleted (which a held
-- xmin horizon keeps: a pg_dump, a long report, a replica's
-- hot_standby_feedback) cost it nothing. The floor lives in the relay's
-- memory; see docs/relay.md ("The floor") for why it never passes a row that
-- can still commit.
--
-- A floor may pass rows a parked row holds back (same topic and key, later
-- id). When an operator retries or discards a parked row, those rows can be
-- claimed again: the action records the parked row's slot and id here, and
-- the next claim of that slot starts no later than that id (and deletes the
-- record). Rows are few (one per operator action) and short-lived.
CREATE TABLE pgbox_outbox_rewinds (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot       smallint    NOT NULL,
    from_id    bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pgbox_outbox_rewinds_slot_idx ON pgbox_outbox_rewinds (slot);

-- pgbox_outbox_claim is the relay's claim, one call per pass. It is a
-- function so that its planner settings travel with it: the per-slot probe
-- must be an index range scan of pgbox_outbox_claim_idx from the floor, and
-- after ANALYZE of a bloated heap, an emptied heap beside a large index or a
-- burst, a cached generic plan flipped to a sequential scan per slot (and a
-- bitmap scan, which never marks dead index entries). enable_seqscan and
-- enable_bitmapscan off leave the index scan as the only sensible plan.
--
-- Arguments: the instance (lane owner), the lane count, the slots to probe
-- in order, the floor the relay remembers for each and the lane epoch it
-- was established under (a floor from another epoch counts as 0: the lane
-- changed hands since), the most rows one slot gives and the batch size.
--
-- Result: first one row per probed slot that this instance owns now, with
-- id NULL, its epoch, the floor the claim used (after any rewind), the
-- outbox sequence's last value (NULL when the sequence caches values per
-- session or the relay may not read it: the relay then never raises a
-- floor), the rows' snapshot's xmin and when the server started (a restart
-- may hand out sequence values again: the relay forgets its floors); then
-- the rows, slot by slot in the order given, id order within a slot,
-- skipping rows a parked row holds.
-- +goose StatementBegin
CREATE FUNCTION pgbox_outbox_claim(p_instance text, p_lanes int, p_slots int[], p_floors bigint[],
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

-- +goose Down
DROP FUNCTION pgbox_outbox_claim(text, int, int[], bigint[], bigint[], int, int);
DROP TABLE pgbox_outbox_rewinds;
