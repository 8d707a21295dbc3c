package main

import "testing"

// An application_name the operator put in DATABASE_URL (to tell instances
// apart in pg_stat_activity) is kept; without one, connections are named
// pgbox-relay.
func TestPoolConfigApplicationName(t *testing.T) {
	cfg, err := poolConfig("postgres://u@127.0.0.1:5432/db?application_name=relay-eu-1", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.ConnConfig.RuntimeParams["application_name"]; got != "relay-eu-1" {
		t.Fatalf("application_name = %q, want the DSN's relay-eu-1", got)
	}
	cfg, err = poolConfig("postgres://u@127.0.0.1:5432/db", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.ConnConfig.RuntimeParams["application_name"]; got != "pgbox-relay" {
		t.Fatalf("application_name = %q, want pgbox-relay", got)
	}
}
