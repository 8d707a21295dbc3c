-- +goose Up
-- The operator console's audit trail: one row per action an operator took
-- (retry, discard, replay), written by package console whether the action
-- succeeded or not, and shown on the console's audit page. Rows are small and
-- few (people click them), so the table keeps them all; prune it by hand
-- (DELETE ... WHERE at < ...) if a policy requires.
CREATE TABLE pgbox_console_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text        NOT NULL,           -- who: the authenticated name (basic-auth user, token name, proxy user)
    role     text        NOT NULL,           -- viewer or operator, as checked
    action   text        NOT NULL,           -- parked.retry, parked.discard, dead.replay, dead.replay_again
    target   text        NOT NULL,           -- what was asked: the filter or ids, as text
    row_ids  bigint[]    NOT NULL DEFAULT '{}', -- which rows the action selected
    affected bigint      NOT NULL DEFAULT 0, -- how many it changed
    result   text        NOT NULL            -- "ok", or the error
);

-- +goose Down
DROP TABLE pgbox_console_audit;
