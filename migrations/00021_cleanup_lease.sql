-- +goose Up
-- The cleaner's lease (package cleanup): one row, held by the pass that runs,
-- so passes of cleaners sharing a schema run one at a time. A row rather than
-- a session advisory lock, because a session lock does not survive a pooler
-- in transaction mode (pgbouncer): it stays with whichever server session
-- took it, and the unlock lands on another one.
CREATE TABLE pgbox_cleanup_lease (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE pgbox_cleanup_lease;
