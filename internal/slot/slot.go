// Package slot holds the facts that the outbox writer, the relay and the
// readers of the outbox (inspect, the console, pgboxprom) must agree on:
// how many slots the outbox is split into, which slot a row gets, and how
// slots group into lanes. They live in one package that links no Kafka
// client, so each reader reports slots and lanes exactly as the relay owns
// them without linking the relay's producer. The relay's SQL computes the
// lane formula too (slot % lanes); relay's tests check it against [Lane].
package slot

import "hash/fnv"

// Count is the fixed number of slots outbox rows are spread over. The relay
// groups slots into lanes ([Lane]), so its lane count can change without
// rewriting rows, and all rows of one key share a slot, hence a lane. It is
// also the most lanes a relay may have.
const Count = 256

// LanesDefault is the relay's default lane count (relay.LanesDefault), and
// what inspect assumes when no relay ever ran.
const LanesDefault = 16

// Of returns the slot of a row with this key: fnv1a32(key) % Count. Rows
// without a key are spread by their event id (an outbox.EventID).
func Of(key []byte, id [16]byte) int {
	h := fnv.New32a()
	if key == nil {
		_, _ = h.Write(id[8:])
	} else {
		_, _ = h.Write(key)
	}
	return int(h.Sum32() % Count)
}

// Lane returns the lane of slot s when the outbox is split into lanes
// lanes: s % lanes. A lane is owned by one relay instance at a time.
func Lane(s, lanes int) int { return s % lanes }
