// Package outbox writes events into the transactional outbox table
// (pgbox_outbox) inside the caller's business transaction. The relay package
// publishes committed rows to Kafka; a rolled-back transaction leaves nothing.
//
//	tx, _ := pool.Begin(ctx)
//	// ... business writes ...
//	err := outbox.Write(ctx, tx, outbox.Message{Topic: "payments.v1", Key: []byte(orderID), Value: payload})
//	err = tx.Commit(ctx)
//
// A service on database/sql (GORM, bun, sqlc) calls WriteSQL with its
// *sql.Tx, opened on pgx's stdlib driver: the same statement, sent by the pgx
// connection under the *sql.Tx.
//
// Write validates every message first (Kafka topic-name rules, size limit,
// header keys; a header named like one the relay sets, EventIDHeader or
// CreatedAtHeader, is refused rather than silently replaced) and then inserts all of them in one round trip. An invalid
// message makes Write return an error wrapping ErrInvalidMessage that names it
// (index, topic, key); nothing is written and the transaction stays usable.
//
// Each row gets an EventID, a UUIDv7 made in Go, which the relay sends as the
// "pgbox-event-id" header: a consumer dedupes on it (pgbox's inbox with
// inbox.ByHeader("pgbox-event-id")), which absorbs the duplicates an
// at-least-once relay can produce.
//
// Each row also gets a slot, fnv1a32(key) % 256, computed at write time. The
// relay maps slots to lanes (slot % Lanes) and gives each lane to one relay
// instance at a time, which is what keeps one key's events in order.
//
// Order. Rows of one key are published in id order. Ids are taken at insert
// time, so for "id order = commit order" two transactions writing events of
// the same key must serialize on something before they write the outbox row
// (typically the business row they both update: UPDATE ... or SELECT ... FOR
// UPDATE first, then outbox.Write). That is what a ledger or order service
// does anyway; unrelated concurrent transactions have no meaningful order.
//
// Wake-up. A relay that found rows in the last two seconds watches the table
// itself (a cheap query every BusyPollInterval, 2 ms) and publishes new rows
// within milliseconds. With Config.Notify, Write also wakes a relay that
// went to sleep (pg_notify on Config.Channel, sent only while a relay
// sleeps); without it a sleeping relay finds the rows at its next poll
// (PollInterval, 1 s). Correctness never depends on notifications.
package outbox
