package relay_test

import "github.com/pgbox/pgbox/relay"

// floorOffOf is why r's floors are off (Stats().FloorOff); a file of its
// own so the tests port to a tree without that field.
func floorOffOf(r *relay.Relay) string { return r.Stats().FloorOff }
