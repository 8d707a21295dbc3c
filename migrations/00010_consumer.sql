-- +goose Up
-- The sarama consumer adapter (inbox.NewConsumerGroupHandler) keeps its retry
-- state here, next to the inbox, so it survives restarts and rebalances.

-- One row per Kafka record whose handler has failed and not yet succeeded or
-- been dead-lettered. Written in its own short transaction after each failed
-- attempt; deleted in the transaction that finally processes or dead-letters
-- the record. topic_id is '' when the broker reports no topic id.
CREATE TABLE pgbox_consumer_attempts (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    topic_id    text        NOT NULL DEFAULT '',
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    attempts    integer     NOT NULL,
    last_error  text        NOT NULL,
    first_at    timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition, "offset", topic_id)
);

-- One row per dead-lettered Kafka record: what failed, how often, and the inbox
-- key it was recorded under (NULL when the record had no usable key). The
-- primary key also makes dead-lettering idempotent: a redelivery after a crash
-- between commit and offset mark never writes a second dead-letter record.
CREATE TABLE pgbox_consumer_dead (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    topic_id    text        NOT NULL DEFAULT '',
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    key         text,
    attempts    integer     NOT NULL,
    error       text        NOT NULL,
    dlq_topic   text        NOT NULL,
    dead_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition, "offset", topic_id)
);

-- +goose Down
DROP TABLE pgbox_consumer_dead;
DROP TABLE pgbox_consumer_attempts;
