package main

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/pgbox/pgbox/inspect"
)

// Option groups of the operator commands.
const (
	groupOps       = "Operator filters"
	groupOpsParked = "Parked rows"
	groupOpsDead   = "Dead letters"
)

// opsOptions are the operator commands' settings (parked, dead).
type opsOptions struct {
	Topic         string
	OlderThan     time.Duration
	Limit         int
	ErrorContains string
	Yes           bool
	Force         bool
	Consumer      string
	ToTopic       string
	Again         bool
}

func (o *opsOptions) bind(s *settings, has map[string]bool) {
	if has[groupOps] {
		s.str(&o.Topic, groupOps, "topic", "PGBOX_OPS_TOPIC", "", "only rows of this topic (parked: the row's topic; dead: the topic consumed); empty: any")
		s.duration(&o.OlderThan, groupOps, "older-than", "PGBOX_OPS_OLDER_THAN", 0, 0, "only rows parked or dead-lettered at least this long ago (0: any age)")
		s.integer(&o.Limit, groupOps, "limit", "PGBOX_OPS_LIMIT", inspect.ListLimitDefault, 1, 1_000_000, "most rows `list` prints (and a discard preview shows)")
	}
	if has[groupOpsParked] {
		s.str(&o.ErrorContains, groupOpsParked, "error-contains", "PGBOX_OPS_ERROR_CONTAINS", "", "only parked rows whose last error contains this text; empty: any")
	}
	if has[groupOpsParked] || has[groupMigrate] {
		g := groupOpsParked
		if !has[groupOpsParked] {
			g = groupMigrate
		}
		s.boolean(&o.Yes, g, "yes", "PGBOX_OPS_YES", false,
			"confirm `parked discard`, or a `migrate down` step that drops rows (without it, either deletes nothing and exits 2)")
	}
	if has[groupMigrate] {
		s.boolean(&o.Force, groupMigrate, "force", "PGBOX_MIGRATE_FORCE", false,
			"`migrate down` even while a relay instance is registered with an unexpired lease")
	}
	if has[groupOpsDead] {
		s.str(&o.Consumer, groupOpsDead, "consumer", "PGBOX_OPS_CONSUMER", "", "only dead letters of this consumer (inbox.Config.Consumer); empty: any")
		s.str(&o.ToTopic, groupOpsDead, "to-topic", "PGBOX_OPS_TO_TOPIC", "", "`replay` writes to this topic instead of each dead letter's source topic")
		s.boolean(&o.Again, groupOpsDead, "again", "PGBOX_OPS_AGAIN", false, "`replay` dead letters replayed before too, as new replays (the consumer processes them once more)")
	}
}

// parseIDs reads positional row ids.
func parseIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageError("invalid id %q: ids are positive integers (see the id column of `list`)", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func nonNilSlice[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
