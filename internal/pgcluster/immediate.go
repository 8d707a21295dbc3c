package pgcluster

import "context"

// StopImmediate stops the server as a crash would (`pg_ctl stop -m
// immediate`: every backend killed, no checkpoint); its data stays for
// StartAgain, which runs crash recovery.
func (c *Cluster) StopImmediate(ctx context.Context) error {
	return c.ctl(ctx, "stop", "-m", "immediate", "-w", "-t", c.timeoutSecs())
}
