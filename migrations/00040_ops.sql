-- +goose Up
-- Operator commands on dead letters (package inspect: ListDead, ReplayDead).
-- A dead-letter row gets an id operators name it by, the record itself (key,
-- value, headers as consumed, so a replay sends exactly that), and what
-- replaying it did. Rows dead-lettered before this migration have
-- record_stored = false: they cannot be replayed from the database (their
-- payload is in the dead-letter topic and at the source offset in Kafka).
-- The table holds failures only, so adding the identity (a rewrite) is quick.
ALTER TABLE pgbox_consumer_dead
    ADD COLUMN id             bigint GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN record_stored  boolean NOT NULL DEFAULT false,
    ADD COLUMN record_key     bytea,                 -- NULL: no key
    ADD COLUMN record_value   bytea,                 -- NULL: tombstone
    ADD COLUMN record_headers jsonb,                 -- [{"k": name, "v": base64 value}], as pgbox_outbox.headers
    ADD COLUMN replays        integer NOT NULL DEFAULT 0, -- replays written so far (ReplayDead; more than 1 only with Again)
    ADD COLUMN replayed_at    timestamptz,           -- the last replay
    ADD COLUMN replayed_to    text;                  -- its topic

CREATE UNIQUE INDEX pgbox_consumer_dead_id_idx ON pgbox_consumer_dead (id);

-- +goose Down
DROP INDEX pgbox_consumer_dead_id_idx;
ALTER TABLE pgbox_consumer_dead
    DROP COLUMN replayed_to, DROP COLUMN replayed_at, DROP COLUMN replays,
    DROP COLUMN record_headers, DROP COLUMN record_value, DROP COLUMN record_key,
    DROP COLUMN record_stored, DROP COLUMN id;
