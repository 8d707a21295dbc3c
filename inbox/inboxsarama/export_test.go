package inboxsarama

import "github.com/pgbox/pgbox/inbox"

// SetAfterCommitForTest installs a hook that runs after each transaction of h
// committed and before its offsets are marked: crash tests stop the process
// exactly there.
func SetAfterCommitForTest(h *Handler, f func([]inbox.Message)) { h.loop.SetAfterCommit(f) }
