package relay

import "time"

// SetFleetEmptySlow sets how long the idle question of f's targets may
// take before it counts as slow (emptySlow): a test makes a held horizon's
// dead rows slow enough on any machine. Call it before Run.
func SetFleetEmptySlow(f *Fleet, d time.Duration) { f.emptySlow = d }
