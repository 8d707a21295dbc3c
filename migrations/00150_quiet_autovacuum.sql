-- +goose Up
-- Fewer autovacuum passes over the tables the relay reads and writes at every
-- claim and heartbeat (issue 35).
--
-- A vacuum or an analyze of a table writes its new size and statistics to
-- pg_class, and that invalidates every cached plan over the table in every
-- backend: the claim function's statements, the finish, the watch, the
-- writers' INSERT and its trigger are all planned again at their next call,
-- in every connection that ran them. One table is nothing; a database of
-- many schemas is autovacuum's pass over all of their busy tables within a
-- second or two. make tenants (1,000 schemas, 100 of them written at 10
-- rows/s each) measured a stall of 1-4 s at each pass, which set the
-- commit-to-Kafka p99 (docs/tenants-scale.md), while autovacuum's own CPU
-- was under a tenth of a core: the replanning is the cost.
--
-- PostgreSQL's defaults vacuum a table after 50 dead rows (plus a share of
-- its size) and analyze it after 50 changed rows, so a queue table written
-- at 10 rows/s, and the relay's lane, marker and instance rows renewed
-- every few seconds, were due at every pass (once a minute by default), its
-- history samples (written and pruned by every relay) every few minutes.
-- These thresholds make them due after 10,000 instead: at 10 rows/s an
-- outbox is vacuumed about every 17 minutes, and an outbox written faster
-- still at every pass, as before (00002's scale factors stay: a large
-- backlog is vacuumed as eagerly as ever).
--
-- What it costs:
--   * pgbox_outbox keeps up to 10,000 dead rows (plus 1% of its size)
--     between vacuums: a few MB of heap and index. The claim reads each
--     slot from its floor, above the dead rows a finish leaves behind, and
--     an index scan marks the dead entries it passes so the next skips them.
--   * The insert-only case (a relay down, a backlog growing) is vacuumed
--     after 10,000 inserts plus 20% of the table, not 1,000.
--   * pgbox_relay_history (a few thousand rows per relay, pruned as they
--     age) keeps up to 10,000 dead ones; nothing reads it on the relay's
--     path but its own insert, which reads the outbox.
--   * pgbox_relay_lanes, pgbox_relay_marker and pgbox_relay_instances are a
--     few rows each, updated in place (HOT: no indexed column changes), so
--     each page is pruned as it fills without a vacuum; their statistics
--     change no plan (the relay's statements plan generic, the claim with
--     sequential and bitmap scans off).
--   * Anti-wraparound vacuums are not affected.
--
-- An operator's own settings for these tables are replaced by this step
-- (ALTER TABLE ... SET after it restores them; relay migrate up does not
-- run it again). It takes a SHARE UPDATE EXCLUSIVE lock on each table,
-- which blocks no reader or writer.
ALTER TABLE pgbox_outbox SET (autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_threshold = 10000,
                              autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_lanes SET (autovacuum_vacuum_threshold = 10000, autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_marker SET (autovacuum_vacuum_threshold = 10000, autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_instances SET (autovacuum_vacuum_threshold = 10000, autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_history SET (autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_threshold = 10000,
                                     autovacuum_analyze_threshold = 10000);

-- +goose Down
ALTER TABLE pgbox_outbox RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_insert_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_lanes RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_marker RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_instances RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_history RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_insert_threshold, autovacuum_analyze_threshold);
