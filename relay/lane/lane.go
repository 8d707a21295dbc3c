// Package lane holds the relay's lane facts — how many lanes the outbox is
// split into by default and which lane an outbox slot belongs to — in a
// package that links no Kafka client, so that readers of the outbox
// (inspect, the console, pgboxprom) report lanes exactly as the relay owns
// them without linking the relay's producer. Package relay re-exports both
// ([relay.LanesDefault], [relay.LaneOf]); its SQL computes the same formula.
package lane

// Default is the relay's default lane count (relay.Config.Lanes).
const Default = 16

// Of returns the lane of an outbox slot (outbox.SlotOf) when the outbox is
// split into lanes lanes: slot % lanes. A lane is owned by one relay
// instance at a time.
func Of(slot, lanes int) int { return slot % lanes }
