package outbox

import (
	"context"
	"time"
)

// The relay's client-neutral surface. The relay (package relay) links a
// Kafka client; the packages that observe it (pgboxprom's metrics,
// pgboxotel's spans) read it through these types, which live here so that
// they link no Kafka client: a service that runs no relay, or consumes with
// another client, never links the relay's.

// PublishHook, set as relay.Config.PublishHook, is told about every batch the
// relay publishes: one call per pass that sends rows, before they are sent,
// and the end func it returns once Kafka has answered. It is the relay's
// tracing seam: pgboxotel.Tracer implements it (one producer span per
// batch, linked to each writer's trace), and the relay itself imports no
// tracing library. It is called from the relay's worker goroutine, one
// batch at a time; it must not block (it delays the publish) nor keep the
// records' slices after returning.
type PublishHook interface {
	StartPublish(ctx context.Context, records []PublishRecord) (end func(published int, err error))
}

// PublishRecord is one row of a batch as a [PublishHook] sees it: the record
// the relay is about to send, before pgbox's own headers are added.
type PublishRecord struct {
	Topic   string
	Key     []byte // nil: no key
	EventID string // the value of the EventIDHeader the record will carry
	Headers []Header
}

// RelayStats are a relay's counters since it was made (relay.Relay.Stats).
// A metrics exporter reads them (pgboxprom.Config.Relay).
type RelayStats struct {
	// Published counts records Kafka acknowledged (their rows are then deleted).
	Published uint64
	// Retried counts row sends that failed and were left for a later pass
	// (broker outages and permanent failures below MaxAttempts).
	Retried uint64
	// Parked counts rows parked after MaxAttempts permanent failures.
	Parked uint64
	// Batches counts non-empty passes (claim, send, delete).
	Batches uint64
	// BatchLatency* describe non-empty passes, claim to delete.
	BatchLatencyLast, BatchLatencyMax, BatchLatencyTotal time.Duration
	// Backlog is the number of unpublished, unparked rows in the whole outbox,
	// counted up to 100,000 at the first heartbeat and every fifth after it
	// (every 10 s by default), in a statement of its own that no heartbeat
	// waits for; a lower bound for the first counts after the relay starts
	// under a held xmin horizon, while it finds where each slot's rows
	// begin (docs/relay.md).
	Backlog int64
	// Lanes is how many lanes this instance held at its last heartbeat.
	Lanes int
	// Instances is how many live relay instances the last heartbeat saw.
	Instances int
	// RowsBelowFloor counts committed rows the relay's sweep found below
	// their slot's floor (relay.Config.SweepInterval): each one a hole in
	// the floor's rule, published late rather than lost. Anything but 0 is
	// a bug to report.
	RowsBelowFloor uint64
	// FloorOff says why claims do not start at the floors ("cache": the
	// outbox id sequence caches values; "privilege": the relay's role may
	// not read it; "marker": nor write pgbox_relay_marker), "" when they do.
	FloorOff string
}
