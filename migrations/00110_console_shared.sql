-- +goose Up
-- What the console's replicas share, and what its chart draws.
--
-- pgbox_console_secret holds the key the console signs its forms' CSRF
-- tokens with, so that consoles behind one load balancer (and a restarted
-- one) accept each other's forms. One row, written by the first console
-- that needs it (INSERT ... ON CONFLICT DO NOTHING) and read by the others.
CREATE TABLE pgbox_console_secret (
    name  text        PRIMARY KEY,
    value bytea       NOT NULL,
    at    timestamptz NOT NULL DEFAULT now()
);

-- method: how the actor authenticated (basic, bearer, proxy, none), so a
-- proxy user named like the bearer token's holder is told apart. Rows from
-- before this migration have ''.
ALTER TABLE pgbox_console_audit ADD COLUMN method text NOT NULL DEFAULT '';

-- pgbox_relay_history: one sample per topic, at most every few seconds, of
-- the outbox backlog and the rows a relay instance published since its
-- previous sample; the console's overview draws the last hour. The relay
-- deletes samples older than two hours as it writes, so the table stays a
-- few thousand rows.
CREATE TABLE pgbox_relay_history (
    at        timestamptz NOT NULL DEFAULT now(),
    topic     text        NOT NULL,
    backlog   bigint      NOT NULL,
    published bigint      NOT NULL
);
CREATE INDEX pgbox_relay_history_at_idx ON pgbox_relay_history (at);

-- +goose Down
DROP TABLE pgbox_relay_history;
ALTER TABLE pgbox_console_audit DROP COLUMN method;
DROP TABLE pgbox_console_secret;
