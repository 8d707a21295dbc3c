package inspect

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// InstancesSleeping reports, per relay instance, whether it sleeps: it found
// no rows for a while and waits for a NOTIFY (or its poll interval) instead
// of watching the table. A sleeping instance with a growing backlog is not
// being woken (writers without outbox.Config.Notify, or a pgbouncer that
// drops LISTEN).
func InstancesSleeping(ctx context.Context, db Querier) (map[string]bool, error) {
	rows, err := db.Query(ctx, sqlInstanceSleeping)
	if err != nil {
		return nil, fmt.Errorf("inspect: read pgbox_relay_instances: %w", schemaHint(err))
	}
	out := map[string]bool{}
	var name string
	var sleeping bool
	_, err = pgx.ForEachRow(rows, []any{&name, &sleeping}, func() error {
		out[name] = sleeping
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: read pgbox_relay_instances: %w", schemaHint(err))
	}
	return out, nil
}

// InstanceState says whether instance i of s runs and reaches Kafka, in the
// words `relay status` prints: "live", "running, connecting to Kafka",
// "running, Kafka unreachable since …" or "expired". The console shows the
// same words.
func (s *Snapshot) InstanceState(i Instance) string { return instanceState(s, i) }
