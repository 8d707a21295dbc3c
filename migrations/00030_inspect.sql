-- +goose Up
-- Status and metrics (package inspect) read each consumer's oldest key per
-- source topic, to compare it with the topic's cleanup cutoff. This index
-- answers that with one probe per (consumer, topic) pair, in a loose index
-- scan, however many keys the inbox holds; without it the read scans the
-- whole inbox on every scrape. It costs each inbox insert one more index entry.
--
-- Built in the migration's transaction (CREATE INDEX CONCURRENTLY would wait
-- for every open transaction of the database, a reporting query included).
-- Building it blocks inbox writes for as long as the build takes: on a large
-- live inbox, create it concurrently first, by hand, and this migration then
-- finds it in place:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS pgbox_inbox_consumer_topic_age_idx
--       ON pgbox_inbox (consumer, topic, (GREATEST(received_at, record_at)));
CREATE INDEX IF NOT EXISTS pgbox_inbox_consumer_topic_age_idx
    ON pgbox_inbox (consumer, topic, (GREATEST(received_at, record_at)));

-- +goose Down
DROP INDEX IF EXISTS pgbox_inbox_consumer_topic_age_idx;
