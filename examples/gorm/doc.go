// Package gormexample shows pgbox inside a GORM transaction: inbox.ProcessSQL and
// outbox.WriteSQL take the *sql.Tx that GORM's postgres driver (pgx's
// stdlib underneath) opened for db.Transaction, so the business rows GORM
// writes, the inbox key and the outbox row commit together. See
// Example in example_test.go, which runs against a real database
// (DATABASE_URL; database_test.go makes a migrated schema of its own). The
// directory imports only pgbox's public packages: copy it into a module of
// your own as it is.
package gormexample
