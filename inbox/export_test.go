package inbox

import "time"

// SetProbeWindow sets how long ib's batches probe for known keys after one
// met a key seen before (probeWindow otherwise). Call it before ib is used.
func SetProbeWindow(ib *Inbox, d time.Duration) { ib.probeFor = d }
