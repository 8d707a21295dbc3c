-- +goose Up
-- A sequence set back while writers and relays run hands out no id below
-- a relay's settled bound again.
--
-- The writers' statement trigger (00120) moves a sequence that went back
-- forward to pgbox_relay_marker.seq_hw, and the relay's floors stay at or
-- below seq_hw. But its settled bound (relay/floor.go: no row up to it can
-- still appear) was not: a claim's sequence read could settle above the
-- seq_hw of its time, held down only by the seq_hw of each later claim.
-- Once seq_hw rose, ids handed out again between the two were below the
-- floors: by writers whose trigger read seq_hw just before a claim that had
-- read the sequence before the reset raised it (found once by make test in
-- stop 51, TestAttack150SequenceResetOverDeadRows/setval: four rows waited
-- for the sweep and a key's later event went out first; made deterministic
-- by relay.TestSequenceResetUnderALateClaimKeepsFirstRows), and by a reset
-- to a value at or above seq_hw, which no trigger moves forward
-- (relay.TestAttack170ResetAtOrAboveSeqHWIsNotCounted). The relay now
-- records each sample at most at the seq_hw its claim left (floor.go), so
-- nothing it settles is handed out again, given what follows.
--
-- 1. Writers read seq_hw outside any snapshot. A REPEATABLE READ or
-- SERIALIZABLE writer read the marker with its transaction's snapshot,
-- taken at its first statement, before it had a transaction id: it could
-- read a seq_hw older than samples that settled before its transaction id
-- and take ids the relay had settled
-- (relay.TestAttack170bRepeatableReadWriterReadsStaleSeqHW). Every raise
-- of seq_hw is now copied, by the claim's own UPDATE of the marker (a
-- trigger), to the sequence pgbox_relay_seq_hw, which is not transactional:
-- visible at once, before the claim commits. The writers' triggers read
-- the greater of the two, after taking their transaction id: a writer
-- that read an older value took its transaction id before the claim raised
-- seq_hw, so before that claim committed, and below the transaction id the
-- claim's sample is paired with.
-- The copy only goes up (a marker emptied by crash recovery, an UPDATE
-- setting seq_hw lower, leave it: moving a sequence forward is always safe).
--
-- 2. A statement whose trigger ran before the reset and whose rows took
-- their ids after it (an INSERT ... SELECT slow to compute its rows, a
-- COPY): its trigger found nothing to move; the row trigger gave each such
-- row a fresh id from the same reset sequence, below what the statement had
-- seen and below the floors
-- (relay.TestAttack170ResetBetweenStatementTriggerAndIDs). Now a fresh id
-- still at or below what the statement saw moves the sequence forward, as
-- the statement trigger does, under its lock.
--
-- 3. setval(seq, n, false) and ALTER SEQUENCE ... RESTART [WITH n] leave
-- the sequence not yet called: pg_sequence_last_value is NULL, which the
-- statement trigger read as 0, below seq_hw, and it set the sequence BACK
-- to seq_hw, below n: writers took ids already handed out (duplicate keys
-- while those rows were in the outbox; the operator's jump lost:
-- relay.TestAttack170bSetvalNotCalledForwardIsSetBack). A sequence not yet
-- called is read as n - 1 (its next id is n).
--
-- 4. A reset between the rows of one multi-row statement: 2.'s move
-- forward to what the statement saw was below the ids its own earlier rows
-- took, and the statement failed on the primary key
-- (relay.TestAttack170bResetBetweenRowsOfOneStatement): it moves past the
-- outbox's highest id too (the earlier rows are visible to the trigger).
--
-- The review of a first version (which counted resets for the claim to
-- notice) found 2 and the case above seq_hw; the review of the second
-- found 1, 3 and 4. Writers pay one sequence read per statement more;
-- claims nothing (their UPDATE of the marker, every 64 ids or so, fires
-- the copy).
--
-- Down restores 00120's trigger functions and keeps the copy, its trigger
-- and function (00120's Down drops them): a writer that started with this
-- migration's body while Down committed still finds them
-- (TestAttack160DownUpUnderRunningRelay); Up again reuses them.
CREATE SEQUENCE IF NOT EXISTS pgbox_relay_seq_hw AS bigint MINVALUE 0 START 0 CACHE 1;
SELECT setval('pgbox_relay_seq_hw', greatest(coalesce((SELECT m.seq_hw FROM pgbox_relay_marker m), 0),
                                             coalesce(pg_sequence_last_value('pgbox_relay_seq_hw'), 0)));

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_relay_marker_hw() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $fn$
BEGIN
    IF NEW.seq_hw > coalesce(pg_sequence_last_value('pgbox_relay_seq_hw'::regclass), 0) THEN
        PERFORM setval('pgbox_relay_seq_hw'::regclass, NEW.seq_hw);
    END IF;
    RETURN NULL;
END
$fn$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = 'pgbox_relay_marker'::regclass
                      AND t.tgname = 'pgbox_relay_marker_hw') THEN
        CREATE TRIGGER pgbox_relay_marker_hw AFTER INSERT OR UPDATE OF seq_hw ON pgbox_relay_marker
            FOR EACH ROW EXECUTE FUNCTION pgbox_relay_marker_hw();
        ALTER TABLE pgbox_relay_marker ENABLE ALWAYS TRIGGER pgbox_relay_marker_hw;
    END IF;
END
$do$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_xid_first() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    v  bigint;
    hw bigint;
BEGIN
    PERFORM pg_current_xact_id();
    v := pg_sequence_last_value('pgbox_outbox_id_seq'::regclass);
    IF v IS NULL THEN -- not yet called (3. above): its next id is last_value
        SELECT s.last_value - 1 INTO v FROM pgbox_outbox_id_seq s;
    END IF;
    -- The sequence went back (setval, RESTART, TRUNCATE ... RESTART
    -- IDENTITY, a restore) below what a relay has seen and may have let
    -- its floors pass: forward again before this statement takes an id.
    -- seq_hw as the marker has it in this statement's snapshot, and every
    -- raise since (pgbox_relay_seq_hw: 1. above). Serialized, so two
    -- statements cannot set it back after each other's ids.
    hw := greatest(coalesce((SELECT m.seq_hw FROM pgbox_relay_marker m), 0),
                   coalesce(pg_sequence_last_value('pgbox_relay_seq_hw'::regclass), 0));
    IF v < hw THEN
        PERFORM pg_advisory_xact_lock('pgbox_outbox_id_seq'::regclass::oid::int, 120);
        v := pg_sequence_last_value('pgbox_outbox_id_seq'::regclass);
        IF v IS NULL THEN
            SELECT s.last_value - 1 INTO v FROM pgbox_outbox_id_seq s;
        END IF;
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
CREATE OR REPLACE FUNCTION pgbox_outbox_fill_slot() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE
    seen bigint := nullif(current_setting('pgbox.outbox_id_seen', true), '')::bigint;
    v    bigint;
    hw   bigint;
BEGIN
    IF NEW.id <= seen THEN
        NEW.id := nextval('pgbox_outbox_id_seq'::regclass); -- an id taken before the statement (00120)
        IF NEW.id <= seen THEN
            -- The sequence went back after the statement's trigger ran
            -- (2. above): forward again, as that trigger does, under its
            -- lock, to at least what the statement saw.
            PERFORM pg_advisory_xact_lock('pgbox_outbox_id_seq'::regclass::oid::int, 120);
            -- And above the ids this statement's earlier rows took (after
            -- seen, before the reset; visible here), and committed rows':
            -- greatest(seen, seq_hw) alone handed them out again
            -- (relay.TestAttack170bResetBetweenRowsOfOneStatement).
            hw := greatest(seen, coalesce((SELECT m.seq_hw FROM pgbox_relay_marker m), 0),
                           coalesce(pg_sequence_last_value('pgbox_relay_seq_hw'::regclass), 0),
                           (SELECT max(o.id) FROM pgbox_outbox o));
            v := pg_sequence_last_value('pgbox_outbox_id_seq'::regclass);
            IF v IS NULL THEN
                SELECT s.last_value - 1 INTO v FROM pgbox_outbox_id_seq s;
            END IF;
            IF v < hw THEN
                PERFORM setval('pgbox_outbox_id_seq'::regclass, hw);
            END IF;
            NEW.id := nextval('pgbox_outbox_id_seq'::regclass);
        END IF;
    END IF;
    IF NEW.slot IS NULL THEN
        NEW.slot := pgbox_outbox_slot(NEW.key, NEW.event_id);
    END IF;
    RETURN NEW;
END
$fn$;
-- +goose StatementEnd

-- The functions read their objects through the schema this migration runs
-- in (as 00160 pinned the trigger functions).
-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_relay_marker_hw() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_xid_first() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_fill_slot() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down
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
CREATE OR REPLACE FUNCTION pgbox_outbox_fill_slot() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
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

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_outbox_xid_first() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION pgbox_outbox_fill_slot() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd
