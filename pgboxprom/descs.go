package pgboxprom

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/inspect"
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// estimateNote is appended to the help of counts that become estimates.
var estimateNote = fmt.Sprintf(" Exact up to Config.Inspect.ExactLimit rows (default %d); past it an estimate from the statistics (the outbox: its live rows in pg_stat, split by pg_stats; the inbox: the planner's), see the matching _estimated gauge.", inspect.ExactLimitDefault)

// Relay, cleanup, inbox and consumer-adapter counters, read from their Stats().
var (
	dPublished = desc("pgbox_relay_published_total", "Records Kafka acknowledged whose outbox rows were deleted.")
	dRetried   = desc("pgbox_relay_retried_total", "Row sends that failed and were left for a later pass.")
	dParked    = desc("pgbox_relay_parked_total", "Rows parked after the maximum number of permanent failures.")
	dBatches   = desc("pgbox_relay_batches_total", "Non-empty relay passes (claim, send, delete).")
	dLatMax    = desc("pgbox_relay_batch_latency_max_seconds", "Longest relay pass so far, claim to delete.")
	dRelayBack = desc("pgbox_relay_backlog_rows", "Unpublished, unparked outbox rows at the relay's last heartbeat (counted up to 100,000).")
	dLanesHeld = desc("pgbox_relay_lanes_held", "Lanes this instance held at its last heartbeat.")
	dInstances = desc("pgbox_relay_instances", "Live relay instances seen at the last heartbeat.")
	dBelow     = desc("pgbox_relay_rows_below_floor_total", "Committed outbox rows the relay's sweep found below their slot's floor and published late: a hole in the floor's rule. Anything but 0 is a bug to report.")
	dTargets   = desc("pgbox_relay_targets", "Targets of a fleet of relays (relay.Fleet, `relay run` with a target list) per state: starting, running, needs operator (retried), stopped; the binary adds refused (not served: schema missing or behind, or no connection budget left).", "state")
	dFloorOff  = desc("pgbox_relay_floor_off", "1 while the relay's claims cannot start at their floors, by reason (cache: the outbox id sequence caches values; privilege: the relay may not read it; marker: nor write pgbox_relay_marker): a held xmin horizon then slows every claim.", "reason")

	dCleanDeleted = desc("pgbox_cleanup_deleted_total", "Rows deleted by cleanup, all tables.")
	dCleanTopic   = desc("pgbox_cleanup_inbox_deleted_total", "Inbox keys deleted by cleanup, by source topic.", "topic")
	dCleanPasses  = desc("pgbox_cleanup_passes_total", "Cleanup passes that ran.")
	dCleanLocked  = desc("pgbox_cleanup_passes_locked_total", "Cleanup passes skipped because another cleaner held the cleanup lease (pgbox_cleanup_lease).")
	dCleanErrors  = desc("pgbox_cleanup_pass_errors_total", "Cleanup passes that ended with an error.")
	dCleanSkipped = desc("pgbox_cleanup_topics_skipped_total", "Topic-passes where neither cleanup rule could run (Kafka unreachable, topic unknown to Kafka...).")
	dCleanLast    = desc("pgbox_cleanup_last_pass_timestamp_seconds", "Start of the last cleanup pass that ran (Unix time).")
	dCleanMargin  = desc("pgbox_inbox_retention_margin_seconds", "Window minus the oldest key's age after the last pass, by topic; negative means overdue keys.", "topic")

	dInboxProcessed = desc("pgbox_inbox_processed_total", "Messages whose handler ran (in-process inbox).")
	dInboxDup       = desc("pgbox_inbox_duplicates_total", "Dedup hits: messages skipped because their key was seen before (in-process inbox).")

	dConsProcessed = desc("pgbox_consumer_processed_total", "Messages the consumer adapter processed and committed.")
	dConsDup       = desc("pgbox_consumer_duplicates_total", "Messages the consumer adapter skipped as already processed.")
	dConsFailures  = desc("pgbox_consumer_failures_total", "Handler attempts that failed and count toward the maximum attempts.")
	dConsTransient = desc("pgbox_consumer_transient_errors_total", "Attempts that failed on a transient database error (not counted toward the maximum).")
	dConsOperator  = desc("pgbox_consumer_operator_errors_total", "Database errors that need an operator (missing table or column, revoked grant) and ended a claim; never counted as message attempts.")
	dConsDead      = desc("pgbox_consumer_dead_lettered_total", "Messages dead-lettered by the consumer adapter.")
	dConsRetries   = desc("pgbox_consumer_retries_total", "Handler attempts repeated after a failure.")
)

// Database metrics, read at scrape time through package inspect.
var (
	dUnpublished = desc("pgbox_outbox_unpublished_rows", "Unpublished, unparked outbox rows, by topic and lane (read at scrape)."+
		estimateNote+" Estimates are per topic, with lane=\"\".", "topic", "lane")
	dUnpubEst  = desc("pgbox_outbox_unpublished_rows_estimated", "1 when pgbox_outbox_unpublished_rows are planner estimates, 0 when exact.")
	dParkedRow = desc("pgbox_outbox_parked_rows", "Parked outbox rows, by topic (read at scrape; counted up to Config.Inspect.ExactLimit rows in all).", "topic")
	dOldest    = desc("pgbox_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished, unparked outbox row (0 when none). Exact: one index probe per slot.")
	dLaneAge   = desc("pgbox_outbox_lane_oldest_unpublished_age_seconds", "Age of each lane's oldest unpublished, unparked outbox row (0 when none). Exact.", "lane")
	dLaneOwner = desc("pgbox_relay_lane_owner", "1 for each lane and the instance holding its lease (read at scrape).", "lane", "owner")
	dUnowned   = desc("pgbox_relay_lanes_unowned", "Lanes whose lease no live relay instance holds (read at scrape); 0 while every live instance is dormant (a relay.Fleet target idle for DormantAfter: it takes its lanes back when rows come).")

	dInboxKeys   = desc("pgbox_inbox_keys", "Inbox keys by consumer and source topic (read at scrape)."+estimateNote, "consumer", "topic")
	dInboxKeyEst = desc("pgbox_inbox_keys_estimated", "1 when pgbox_inbox_keys for this consumer and topic is a planner estimate, 0 when exact.", "consumer", "topic")
	dInboxAge    = desc("pgbox_inbox_oldest_key_age_seconds", "Age of the oldest inbox key, by consumer and source topic, measured as cleanup does (later of receive time and record timestamp). Exact.", "consumer", "topic")
	dInboxWindow = desc("pgbox_inbox_cleanup_window_seconds", "How long cleanup keeps the topic's keys (retention.ms + segment.ms + buffer, or a forced window); absent when never pruned or unknown.", "consumer", "topic")
	dInboxCut    = desc("pgbox_inbox_cleanup_cutoff_timestamp_seconds", "Cleanup cutoff (Unix time): keys older are due for deletion; the oldest key's age past the window means cleanup is behind.", "consumer", "topic")
	dDeadRows    = desc("pgbox_consumer_dead_letter_rows", "Dead-lettered messages recorded by the consumer adapter, by consumer and topic (read at scrape; counted up to Config.Inspect.ExactLimit rows in all).", "consumer", "topic")

	dDBUp     = desc("pgbox_scrape_database_up", "1 if the database answered the scrape (even slowly or with a statement timeout), 0 if it could not be reached.")
	dScrapeS  = desc("pgbox_scrape_database_duration_seconds", "How long the scrape's database reads took: a slow database shows here, not as down.")
	dScrapeOK = desc("pgbox_scrape_database_snapshot_ok", "1 if the scrape read the whole snapshot; 0 if a read failed or hit the statement timeout (the database metrics are then missing from this scrape).")
)

// detailDescs are the families of a database's detail per topic, lane and
// consumer (exportOutboxDetail, exportInbox): the single database's
// (dbDetail), or a fleet's chosen targets' under names of their own with a
// target label first (targetDetail).
type detailDescs struct {
	unpublished, unpubEst, parked, laneAge                        *prometheus.Desc
	inboxKeys, inboxKeyEst, inboxAge, inboxWindow, inboxCut, dead *prometheus.Desc
}

var dbDetail = &detailDescs{
	unpublished: dUnpublished, unpubEst: dUnpubEst, parked: dParkedRow, laneAge: dLaneAge,
	inboxKeys: dInboxKeys, inboxKeyEst: dInboxKeyEst, inboxAge: dInboxAge, inboxWindow: dInboxWindow, inboxCut: dInboxCut, dead: dDeadRows,
}

var allDescs = []*prometheus.Desc{
	dPublished, dRetried, dParked, dBatches, dLatMax, dRelayBack, dLanesHeld, dInstances, dBelow, dFloorOff, dTargets,
	dCleanDeleted, dCleanTopic, dCleanPasses, dCleanLocked, dCleanErrors, dCleanSkipped, dCleanLast, dCleanMargin,
	dInboxProcessed, dInboxDup,
	dConsProcessed, dConsDup, dConsFailures, dConsTransient, dConsOperator, dConsDead, dConsRetries,
	dUnpublished, dUnpubEst, dParkedRow, dOldest, dLaneAge, dLaneOwner, dUnowned,
	dInboxKeys, dInboxKeyEst, dInboxAge, dInboxWindow, dInboxCut, dDeadRows,
	dDBUp, dScrapeS, dScrapeOK,
	dHorizonAge, dHorizonXacts,
}
