-- +goose Up
-- Relay instances announce themselves here; an instance whose expires_at has
-- passed is dead, and its lanes go to the others. Times are the database's
-- clock (now()), so relay hosts' clocks don't matter.
CREATE TABLE pgbox_relay_instances (
    instance     text        PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- One row per lane: which instance may publish the lane's slots
-- (slot % lanes = lane) and until when. epoch changes on every change of
-- owner; a relay's deletes and parks name the epoch it claimed under, so an
-- instance that lost a lane (paused, partitioned) cannot touch its rows.
CREATE TABLE pgbox_relay_lanes (
    lane       integer     PRIMARY KEY,
    lanes      integer     NOT NULL,     -- the lane count these rows were made for
    owner      text,                     -- NULL: free
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    epoch      bigint      NOT NULL DEFAULT 0,
    CHECK (lane >= 0 AND lane < lanes)
);

CREATE SEQUENCE pgbox_relay_epoch;

-- +goose Down
DROP SEQUENCE pgbox_relay_epoch;
DROP TABLE pgbox_relay_lanes;
DROP TABLE pgbox_relay_instances;
