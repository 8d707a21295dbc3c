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
-- nothing it settles can be handed out again: every statement moves the
-- sequence forward to at least the seq_hw it reads, and a writer that read
-- an older one took its transaction id before that claim committed, so
-- before the statement the sample is paired with.
--
-- One writer was left: a statement whose trigger ran before the reset and
-- whose rows took their ids after it (an INSERT ... SELECT slow to compute
-- its rows, a COPY). Its trigger found nothing to move; the row trigger
-- below gave each such row a fresh id, from the same reset sequence, below
-- what the statement had seen and below the floors
-- (relay.TestAttack170ResetBetweenStatementTriggerAndIDs). Now a fresh id
-- still at or below what the statement saw moves the sequence forward, as
-- the statement trigger does, under its lock. Found by the review of this
-- migration's first version, which counted resets for the claim to notice
-- instead (dropped: it missed both cases and cost each claim two function
-- calls). Down restores 00120's row trigger function.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgbox_outbox_fill_slot() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $fn$
DECLARE
    seen bigint := nullif(current_setting('pgbox.outbox_id_seen', true), '')::bigint;
    hw   bigint;
BEGIN
    IF NEW.id <= seen THEN
        NEW.id := nextval('pgbox_outbox_id_seq'::regclass); -- an id taken before the statement (00120)
        IF NEW.id <= seen THEN
            -- The sequence went back after the statement's trigger ran
            -- (see the header): forward again, as that trigger does, under
            -- its lock, to at least what the statement saw.
            PERFORM pg_advisory_xact_lock('pgbox_outbox_id_seq'::regclass::oid::int, 120);
            SELECT greatest(seen, m.seq_hw) INTO hw FROM pgbox_relay_marker m;
            hw := coalesce(hw, seen);
            IF coalesce(pg_sequence_last_value('pgbox_outbox_id_seq'::regclass), 0) < hw THEN
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

-- +goose StatementBegin
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION pgbox_outbox_fill_slot() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd

-- +goose Down
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
    EXECUTE format('ALTER FUNCTION pgbox_outbox_fill_slot() SET search_path = %I, pg_temp', current_schema());
END
$do$;
-- +goose StatementEnd
