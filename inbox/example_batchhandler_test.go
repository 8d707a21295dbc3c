package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// A ledger import with a batch handler: the batch's new entries go in with
// one INSERT … SELECT … FROM unnest, their events with one outbox.Write, and
// an entry that cannot be parsed is failed alone with a BatchError. The
// inboxsarama and inboxfranz adapters call the same handler for each batch
// they claim (inbox.ConsumerConfig.BatchHandler) and cut a batch at its first
// failed message.
func ExampleInbox_ProcessBatchAtOnce() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (entry text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(inbox.Config{Consumer: "ledger-import", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}

	importEntries := func(ctx context.Context, tx pgx.Tx, ms []inbox.Message) error {
		var failed inbox.BatchError
		entries, amounts := make([]string, 0, len(ms)), make([]int64, 0, len(ms))
		events := make([]outbox.Message, 0, len(ms))
		for i, m := range ms {
			amount, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				failed.Add(i, inbox.Permanent(fmt.Errorf("amount %q: %w", m.Value, err)))
				continue
			}
			entries, amounts = append(entries, string(m.Key)), append(amounts, amount)
			events = append(events, outbox.Message{Topic: "ledger.v1", Key: m.Key, Value: m.Value})
			if err := inbox.SetBatchResult(ctx, i, []byte("booked "+string(m.Key))); err != nil {
				return err
			}
		}
		if err := failed.Err(); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger (entry, amount)
			SELECT * FROM unnest($1::text[], $2::bigint[])`, entries, amounts); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, events...) // one statement for the batch's events
	}

	msg := func(offset int64, entry, amount string) inbox.Message {
		return inbox.Message{Topic: "ledger-entries", Partition: 0, Offset: offset, Key: []byte(entry), Value: []byte(amount),
			Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-" + entry)}}}
	}
	run := func(ms []inbox.Message) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.ProcessBatchAtOnce(ctx, tx, ms, importEntries)
			for i, r := range res {
				fmt.Printf("  %s duplicate=%v stored=%q\n", ms[i].Key, r.Duplicate, r.Stored)
			}
			return err
		})
		var me *inbox.MessageError
		if errors.As(err, &me) {
			fmt.Printf("  message %d (%s) failed: %v; permanent: %v\n", me.Index, me.Message, me.Err, errors.Is(err, inbox.ErrPermanent))
		} else if err != nil {
			log.Fatal(err)
		}
	}

	fmt.Println("first delivery:")
	run([]inbox.Message{msg(0, "a", "100"), msg(1, "b", "250"), msg(2, "c", "40")})
	fmt.Println("redelivered with new entries:")
	run([]inbox.Message{msg(1, "b", "250"), msg(2, "c", "40"), msg(3, "d", "7")})
	fmt.Println("a bad entry fails the batch, naming it:")
	run([]inbox.Message{msg(4, "e", "12"), msg(5, "f", "twelve")})

	var entries, events int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM pgbox_outbox)`).Scan(&entries, &events); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger entries:", entries, "events:", events)
	// Output:
	// first delivery:
	//   a duplicate=false stored="booked a"
	//   b duplicate=false stored="booked b"
	//   c duplicate=false stored="booked c"
	// redelivered with new entries:
	//   b duplicate=true stored="booked b"
	//   c duplicate=true stored="booked c"
	//   d duplicate=false stored="booked d"
	// a bad entry fails the batch, naming it:
	//   message 1 (ledger-entries/0@5) failed: handler: amount "twelve": strconv.ParseInt: parsing "twelve": invalid syntax; permanent: true
	// ledger entries: 4 events: 4
}
