-- +goose Up
-- The inbox's offset-watermark mode (inbox.DedupWatermark): one row per
-- (consumer, topic, partition) holding the highest offset whose effects have
-- committed, updated in the consumer's business transaction. A record at or
-- below it is a duplicate. O(partitions) rows, updated in place: nothing for
-- cleanup to prune.
--
-- topic_id is the topic's Kafka id when the consumer knows it ('' otherwise):
-- a record carrying a different id belongs to a topic deleted and recreated
-- under the same name, whose offsets restart at 0; the row then starts over.
-- previous_offset is the offset the row held before the last update (NULL when
-- the row, or the topic incarnation, is new): it lets the update report a gap
-- (offsets never seen by this consumer) in the same statement.
CREATE TABLE pgbox_inbox_watermark (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL,
    topic_id        text        NOT NULL DEFAULT '',
    "offset"        bigint      NOT NULL,
    previous_offset bigint,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

-- Every commit of a consumer rewrites one of its few rows: leave room on the
-- page for HOT updates and vacuum often.
ALTER TABLE pgbox_inbox_watermark SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000);

-- +goose Down
DROP TABLE pgbox_inbox_watermark;
