package gormexample_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/outbox"
)

// Payment is the service's GORM model.
type Payment struct {
	OrderID string `gorm:"primaryKey"`
	Amount  int64
}

// sqlTx is the *sql.Tx under a GORM transaction: what db.Transaction hands
// its func holds it in Statement.ConnPool (with gorm.Config.PrepareStmt, a
// *gorm.PreparedStmtTX wraps it).
func sqlTx(gtx *gorm.DB) (*sql.Tx, error) {
	switch p := gtx.Statement.ConnPool.(type) {
	case *sql.Tx:
		return p, nil
	case *gorm.PreparedStmtTX:
		if tx, ok := p.Tx.(*sql.Tx); ok {
			return tx, nil
		}
	}
	return nil, fmt.Errorf("GORM's connection pool is a %T, not a transaction: call this inside db.Transaction", gtx.Statement.ConnPool)
}

// A consumer whose business writes go through GORM: each delivery runs in
// db.Transaction; the inbox dedups it and the handler writes the payment with
// GORM and the reply event with the outbox, in the same transaction.
func Example() {
	ctx := context.Background()
	dsn, drop, err := database(ctx) // a migrated schema of its own on DATABASE_URL (database_test.go)
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Payment{}); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(inbox.Config{Consumer: "payments-svc", Key: inbox.ByHeader("event-id")})
	if err != nil {
		log.Fatal(err)
	}

	consume := func(m inbox.Message, fail bool) error {
		return db.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
			tx, err := sqlTx(gtx)
			if err != nil {
				return err
			}
			res, err := ib.ProcessSQL(ctx, tx, m, func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
				if err := gtx.WithContext(ctx).Create(&Payment{OrderID: string(m.Key), Amount: 100}).Error; err != nil {
					return err
				}
				if err := outbox.WriteSQL(ctx, tx, outbox.Message{Topic: "payments.v1", Key: m.Key, Value: []byte(`{"status":"charged"}`)}); err != nil {
					return err
				}
				if fail {
					return errors.New("card declined")
				}
				return nil
			})
			if err != nil {
				// The payment, the outbox row and the key are rolled back to
				// the inbox's savepoint; GORM's transaction stays usable.
				fmt.Println("error:", err)
				return gtx.Exec(`SELECT 1`).Error
			}
			fmt.Printf("key=%s duplicate=%v\n", res.Key, res.Duplicate)
			return nil
		})
	}

	m := inbox.Message{Topic: "orders", Offset: 7, Key: []byte("order-1"), Value: []byte(`{"amount":100}`),
		Headers: []outbox.Header{{Key: "event-id", Value: []byte("evt-1")}}}
	for _, fail := range []bool{true, false, false} { // a failure, then a delivery, then its duplicate
		if err := consume(m, fail); err != nil {
			log.Fatal(err)
		}
		m.Offset++
	}

	var payments, events int64
	db.Model(&Payment{}).Count(&payments)
	db.Table("pgbox_outbox").Count(&events)
	fmt.Println("payments:", payments, "events:", events)
	// Output:
	// error: inbox: consumer "payments-svc", message orders/0@7, key "evt-1": handler: card declined
	// key=evt-1 duplicate=false
	// key=evt-1 duplicate=true
	// payments: 1 events: 1
}
