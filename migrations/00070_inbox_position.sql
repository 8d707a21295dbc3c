-- +goose Up
-- The exact cleanup rule (package cleanup): a key may go once Kafka's log
-- start offset of the partition of its last-seen copy has passed that copy's
-- offset. pgbox_inbox's topic, partition and "offset" hold that position: the
-- first copy's at insert, moved forward by every later copy on the same
-- partition (never backwards: a rewind redelivers older offsets).
--
-- position_at says the position is known. The inbox stamps it, with
-- received_at, whenever it records a copy's position; a row whose
-- received_at is later (a duplicate recorded by a pgbox that did not move the
-- position) or that is NULL (rows from before this migration; keys whose
-- copies came on two partitions) has an unknown position, and cleanup falls
-- back to the time rule for it. Added without a default (no table rewrite),
-- then given one, so only new rows get it: an older pgbox's inserts record
-- the first copy's position correctly, and its duplicate updates leave
-- position_at behind received_at.
ALTER TABLE pgbox_inbox ADD COLUMN position_at timestamptz;
ALTER TABLE pgbox_inbox ALTER COLUMN position_at SET DEFAULT now();

-- The exact rule reads, per partition, only the keys behind the log start.
-- On a large existing inbox, build it beforehand without blocking writers:
--   CREATE INDEX CONCURRENTLY pgbox_inbox_position_idx ON pgbox_inbox (topic, partition, "offset");
-- (this statement then finds it and does nothing).
CREATE INDEX IF NOT EXISTS pgbox_inbox_position_idx ON pgbox_inbox (topic, partition, "offset");

-- +goose Down
DROP INDEX pgbox_inbox_position_idx;
ALTER TABLE pgbox_inbox DROP COLUMN position_at;
