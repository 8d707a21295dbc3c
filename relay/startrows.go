package relay

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/outboxstats"
)

// Which of a Fleet's targets start awake.
//
// A Fleet's target starts dormant (dormant.go), so a thousand targets
// starting at once do not all take their lanes, heartbeat and claim. One
// whose outbox holds rows then waits for its pool's idle poll to find
// them, behind whatever round of idle questions is under way: a target
// added to a running fleet of 1,000 idle targets took its lanes 830 ms
// after it started (make tenants). So a target whose outbox the
// statistics show holding rows (pg_stat_user_tables.n_live_tup) starts
// awake, as a relay alone does. The statistics only choose how a target
// starts: rows they do not show yet (they lag by a second or so) are
// found by the idle poll, as before, and a target that starts awake for
// nothing goes dormant again after DormantAfter.

// startRowsFor is how long one reading of a pool's statistics serves the
// targets that start after it; startRowsWait bounds the reading.
const (
	startRowsFor  = time.Second
	startRowsWait = time.Second
)

// startRows is a pool's last reading of the statistics (outboxstats.Rows).
type startRows struct {
	mu   sync.Mutex
	at   time.Time
	rows map[string]int64 // by schema (outboxstats.Rows); nil: the reading failed
}

// awake reports whether schema's outbox holds rows by pool's statistics,
// read at most once every startRowsFor (targets starting together wait
// for one reading). No schema (the pool's search_path), a nil s or a
// failed reading: false.
func (s *startRows) awake(ctx context.Context, pool *pgxpool.Pool, schema string) bool {
	if s == nil || schema == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.at) >= startRowsFor {
		s.rows, s.at = readStartRows(ctx, pool), time.Now()
	}
	return s.rows[schema] > 0
}

func readStartRows(ctx context.Context, pool *pgxpool.Pool) map[string]int64 {
	ctx, cancel := context.WithTimeout(ctx, startRowsWait)
	defer cancel()
	rows, err := outboxstats.Rows(ctx, pool)
	if err != nil {
		return nil
	}
	return rows
}

// startGate bounds the targets of a pool that start dormant preparing
// their lanes at once (the transaction of Relay.ensureLanes): a thousand
// targets starting together took the pool's connections from the targets
// already draining a backlog (make tenants: the drain beside 1,000
// starting targets). A target that starts awake does not wait for it.
type startGate chan struct{}

// startGateHold is the longest one start holds its place: a target whose
// lanes table is locked (an operator's transaction) retries with backoff,
// and must not hold back every other target of its pool meanwhile.
const startGateHold = time.Second

// enter waits for a place (until ctx ends; a nil gate has room for
// all) and returns its release: call it once the lanes are prepared; it
// is also called startGateHold after entering.
func (g startGate) enter(ctx context.Context) func() {
	if g == nil {
		return nil
	}
	select {
	case g <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	var once sync.Once
	release := func() { once.Do(func() { <-g }) }
	time.AfterFunc(startGateHold, release)
	return release
}
