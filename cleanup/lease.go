package cleanup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// leaseTTL is how long a pass's lease lasts without renewal; every delete
// batch renews it. A cleaner that dies mid-pass holds the others off for at
// most this long.
const leaseTTL = 5 * time.Minute

// errLeaseLost ends a pass whose lease expired and was taken over (the pass
// stalled for longer than leaseTTL).
var errLeaseLost = errors.New("lost the cleanup lease: the pass stalled for longer than " + leaseTTL.String() + " and another cleaner took over")

// A pass holds the pgbox_cleanup_lease row under a random owner name: a
// lease row, not a session advisory lock, so that it works through a
// transaction-mode pooler too (see sqlTakeLease).

// takeLease tries to take the lease on conn under a new owner name; took is
// false when another cleaner holds it.
func takeLease(ctx context.Context, conn *pgxpool.Conn) (owner string, took bool, err error) {
	owner = newLeaseOwner()
	var n int
	if err := conn.QueryRow(ctx, sqlTakeLease, owner, leaseTTL).Scan(&n); err != nil {
		return "", false, fmt.Errorf("take the cleanup lease: %w", err)
	}
	return owner, n > 0, nil
}

func newLeaseOwner() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// renewLease extends the pass's lease, or reports that it was lost.
func (p *pass) renewLease(ctx context.Context) error {
	tag, err := p.conn.Exec(ctx, sqlRenewLease, p.owner, leaseTTL)
	if err != nil {
		return fmt.Errorf("renew the cleanup lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

// releaseLease releases the pass's lease, also when ctx was cancelled; on
// the pass's connection unless a cancellation closed it.
func (p *pass) releaseLease(ctx context.Context) {
	c := p.c
	if c.hookUnlock != nil {
		c.hookUnlock()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var err error
	for range 2 { // the cancel request of an interrupted statement can land on the first try
		if p.conn.Conn().IsClosed() {
			_, err = c.cfg.Pool.Exec(ctx, sqlReleaseLease, p.owner)
		} else {
			_, err = p.conn.Exec(ctx, sqlReleaseLease, p.owner)
		}
		if err == nil {
			return
		}
	}
	c.cfg.Logger.WarnContext(ctx, "cleanup: release lease failed; it expires by itself", "error", err, "lease_ttl", leaseTTL.String())
}
