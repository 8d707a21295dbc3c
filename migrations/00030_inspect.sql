-- +goose NO TRANSACTION
-- +goose Up
-- Status and metrics (package inspect) read each consumer's oldest key per
-- source topic, to compare it with the topic's cleanup cutoff. This index
-- answers that with one probe per (consumer, topic) pair, in a loose index
-- scan, however many keys the inbox holds; without it the read scans the
-- whole inbox on every scrape. It costs each inbox insert one more index entry.
-- Built CONCURRENTLY: a live inbox keeps accepting writes while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS pgbox_inbox_consumer_topic_age_idx
    ON pgbox_inbox (consumer, topic, (GREATEST(received_at, record_at)));

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS pgbox_inbox_consumer_topic_age_idx;
