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
-- These thresholds make them due far less often:
--   * pgbox_outbox and pgbox_relay_history, queue-like, after 5,000 dead
--     or inserted rows, and analyzed after 10,000 changed ones (a row
--     inserted and deleted is two changes, so both fall due at the same
--     pass, one invalidation rather than two): an outbox written at 10
--     rows/s is vacuumed about every 8 minutes, and one written faster
--     still at every pass, as before (00002's scale factors stay: a large
--     backlog is vacuumed as eagerly as ever). 10,000 dead rows were tried
--     first: the dead rows' cost to the claims (below) doubled too, for
--     passes half as often.
--   * pgbox_relay_lanes, pgbox_relay_marker and pgbox_relay_instances, a
--     few rows each updated in place (HOT: no indexed column changes, so
--     each page is pruned as it fills, without a vacuum), after 100,000:
--     256 lanes renewed every 2 s make 10,000 changes in 80 s.
--
-- What it costs:
--   * pgbox_outbox keeps up to 5,000 dead rows (plus 1% of its size)
--     between vacuums, a few MB of heap and index, and an outbox that goes
--     idle with fewer keeps them until it is written again. Each claim's
--     probe of a slot steps over the dead index entries around it (with
--     10,000 of them, 0.55-0.75 ms a claim against 0.45 ms vacuumed); the
--     idle poll's question reads the claim index, not the table
--     (relay/dormant.go, questionSetSQL).
--   * The insert-only case (a relay down, a backlog growing) is vacuumed
--     after 5,000 inserts plus 20% of the table, not 1,000, and analyzed
--     as rarely: relay status and /metrics read a large backlog from the
--     cumulative statistics' live rows, which need no ANALYZE
--     (inspect's sqlBacklogLive).
--   * The statistics of the three small tables change no plan (the
--     relay's statements plan generic, the claim with sequential and
--     bitmap scans off).
--   * Anti-wraparound vacuums are not affected.
--
-- An operator's own settings of these parameters for these tables are
-- replaced by this step (ALTER TABLE ... SET after it restores them; relay
-- migrate up does not run it again). It takes a SHARE UPDATE EXCLUSIVE lock
-- on each table in turn, which blocks no reader or writer; it waits for a
-- VACUUM of the table (a manual one, an anti-wraparound one, or CREATE
-- INDEX CONCURRENTLY) to end, holding the tables it already altered, so a
-- relay starting meanwhile waits at its lanes.
ALTER TABLE pgbox_outbox SET (autovacuum_vacuum_threshold = 5000, autovacuum_vacuum_insert_threshold = 5000,
                              autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_history SET (autovacuum_vacuum_threshold = 5000, autovacuum_vacuum_insert_threshold = 5000,
                                     autovacuum_analyze_threshold = 10000);
ALTER TABLE pgbox_relay_lanes SET (autovacuum_vacuum_threshold = 100000, autovacuum_analyze_threshold = 100000);
ALTER TABLE pgbox_relay_marker SET (autovacuum_vacuum_threshold = 100000, autovacuum_analyze_threshold = 100000);
ALTER TABLE pgbox_relay_instances SET (autovacuum_vacuum_threshold = 100000, autovacuum_analyze_threshold = 100000);

-- +goose Down
ALTER TABLE pgbox_outbox RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_insert_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_lanes RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_marker RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_instances RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold);
ALTER TABLE pgbox_relay_history RESET (autovacuum_vacuum_threshold, autovacuum_vacuum_insert_threshold, autovacuum_analyze_threshold);
