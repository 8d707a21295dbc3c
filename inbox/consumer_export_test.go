package inbox

// SetAfterCommitForTest installs a hook that runs after each transaction of h
// committed and before its offsets are marked: crash tests stop the process
// exactly there.
func SetAfterCommitForTest(h *ConsumerGroupHandler, f func([]Message)) { h.afterCommit = f }
