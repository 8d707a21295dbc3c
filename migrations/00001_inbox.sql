-- +goose Up
-- One row per (consumer, key) that a consumer has processed. The primary key is
-- the dedup mechanism: INSERT ... ON CONFLICT DO NOTHING under READ COMMITTED
-- makes a second delivery of the same key wait for, then lose to, the first.
CREATE TABLE pgbox_inbox (
    consumer    text        NOT NULL,
    key         text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    fingerprint bytea,                            -- sha256(value); NULL when fingerprints are off
    result      bytea,                            -- what the handler handed back, returned to duplicates
    record_at   timestamptz,                      -- the Kafka record's own timestamp
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, key)
);

-- Cleanup prunes per source topic by age, where age runs from the later of the
-- receive time and the record's timestamp (producer clocks can run ahead).
-- GREATEST ignores NULLs, so rows without a record timestamp use received_at.
CREATE INDEX pgbox_inbox_topic_age_idx ON pgbox_inbox (topic, (GREATEST(received_at, record_at)));

-- Retention deletes in batches: vacuum this table more eagerly than the default.
ALTER TABLE pgbox_inbox SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- +goose Down
DROP TABLE pgbox_inbox;
