package pgboxprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/inspect"
)

// The xmin horizon: who holds back VACUUM of pgbox's tables (inspect.Horizon),
// one series per kind of holder present (inspect.HolderKind: session,
// other_database, replica, replication_slot, replication_slot_catalog,
// prepared_xact). Per-holder detail (pid, application, query) stays out of
// the labels: `relay status` and the console list the holders.
var (
	dHorizonAge = desc("pgbox_xmin_horizon_age_seconds",
		"How long the oldest holder of each kind with a known start (a session's open transaction, a prepared transaction) has held back VACUUM of pgbox's tables (read at scrape). Slots and replicas have no start: see pgbox_xmin_horizon_age_transactions.", "kind")
	dHorizonXacts = desc("pgbox_xmin_horizon_age_transactions",
		"Transactions since the oldest xmin horizon held by each kind of holder, age(xid) (read at scrape); kind=\"replication_slot_catalog\" holds back only the system catalogs.", "kind")
)

// exportHorizon exports snap's xmin horizon per kind of holder.
func exportHorizon(ch chan<- prometheus.Metric, snap *inspect.Snapshot) {
	for _, k := range snap.Horizon.Kinds {
		if k.AgeSeconds != nil {
			gauge(ch, dHorizonAge, *k.AgeSeconds, string(k.Kind))
		}
		gauge(ch, dHorizonXacts, float64(k.AgeTransactions), string(k.Kind))
	}
}
