-- +goose Up
-- Indexes for the cleaner (package cleanup), which prunes the consumer
-- adapter's tables by age in short batches. Both tables hold only failures,
-- so the indexes cost their writers next to nothing.

-- Dead-letter rows are pruned per source topic, never before that topic's
-- inbox keys (they dedupe redeliveries of records without a usable key).
CREATE INDEX pgbox_consumer_dead_topic_age_idx ON pgbox_consumer_dead (topic, dead_at);

-- Attempt rows nobody has updated for long belong to records no consumer
-- retries any more (a consumer group or topic gone).
CREATE INDEX pgbox_consumer_attempts_age_idx ON pgbox_consumer_attempts (updated_at);

-- +goose Down
DROP INDEX pgbox_consumer_attempts_age_idx;
DROP INDEX pgbox_consumer_dead_topic_age_idx;
