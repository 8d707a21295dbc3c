package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/pgbox/pgbox/inbox"
)

// In offset-watermark mode ([DedupWatermark]) the inbox keeps one row per
// partition, the highest offset whose effects committed, instead of a key
// per message: a redelivery at or below it is a duplicate, and a jump
// forward is processed with the offsets it skipped counted in Result.Gap.
func ExampleInbox_Process_watermark() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text, src_offset bigint)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inbox.Config{Consumer: "shipping-svc", Dedup: inbox.DedupWatermark})
	if err != nil {
		log.Fatal(err)
	}
	ship := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1, $2)`, string(m.Key), m.Offset)
		return err
	}
	deliver := func(offset int64) {
		m := inbox.Message{Topic: "orders", Partition: 0, Offset: offset, Key: []byte(fmt.Sprint("order-", offset)), Value: []byte("{}")}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := ib.Process(ctx, tx, m, ship)
			if err == nil {
				fmt.Printf("offset %d: duplicate=%v gap=%d\n", offset, res.Duplicate, res.Gap)
			}
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}

	deliver(5)
	deliver(6)
	deliver(5) // a rewind (or a crash before the offset commit) delivers 5 again
	deliver(9) // the group's offset was reset forward past 7 and 8

	var shipments, keys, watermarks int
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM shipments), (SELECT count(*) FROM pgbox_inbox),
		(SELECT count(*) FROM pgbox_inbox_watermark)`).Scan(&shipments, &keys, &watermarks)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("shipments: %d, inbox keys: %d, watermark rows: %d\n", shipments, keys, watermarks)
	// Output:
	// offset 5: duplicate=false gap=0
	// offset 6: duplicate=false gap=0
	// offset 5: duplicate=true gap=0
	// offset 9: duplicate=false gap=2
	// shipments: 3, inbox keys: 0, watermark rows: 1
}
