-- +goose Up
-- The transactional outbox: outbox.Write inserts rows inside the caller's
-- business transaction; the relay publishes them to Kafka and deletes them.
-- Rows that can never be published stay, parked (parked_at set) with their
-- attempt count and last error, for an operator to inspect or replay.
CREATE TABLE pgbox_outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id   uuid        NOT NULL,                  -- UUIDv7 made by outbox.Write; sent as the pgbox-event-id header
    slot       smallint    NOT NULL CHECK (slot >= 0 AND slot < 256), -- fnv1a32(key) % 256 (internal/slot); lane = slot % Lanes
    topic      text        NOT NULL,
    key        bytea,                                 -- NULL: no key
    value      bytea,                                 -- NULL: tombstone
    headers    jsonb,                                 -- [{"k": name, "v": base64 value or null}], NULL when none
    created_at timestamptz NOT NULL DEFAULT now(),
    attempts   integer     NOT NULL DEFAULT 0,        -- permanent publish failures so far
    last_error text,
    parked_at  timestamptz                            -- set once attempts reach the relay's MaxAttempts
);

-- The relay's claim query probes each owned slot for its oldest unparked rows:
-- WHERE slot = $s AND parked_at IS NULL ORDER BY id LIMIT n. This partial index
-- answers it with one short index range scan per slot, whatever the table
-- size, and leaves parked rows out of the relay's way.
CREATE INDEX pgbox_outbox_claim_idx ON pgbox_outbox (slot, id) WHERE parked_at IS NULL;

-- Parked rows, for operators and Stats.
CREATE INDEX pgbox_outbox_parked_idx ON pgbox_outbox (parked_at) WHERE parked_at IS NOT NULL;

-- A queue table: rows are inserted and deleted at the same rate. Vacuum it
-- eagerly so dead index entries at the head don't pile up.
ALTER TABLE pgbox_outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_analyze_scale_factor = 0.02,
                              autovacuum_vacuum_cost_delay = 0);

-- +goose Down
DROP TABLE pgbox_outbox;
