package relay

import (
	"strconv"
	"strings"

	"github.com/pgbox/pgbox/internal/slot"
)

// slotSet is a set of outbox slots.
type slotSet [slot.Count / 64]uint64

func (s *slotSet) add(slot int) { s[slot/64] |= 1 << (slot % 64) }

func (s *slotSet) union(o *slotSet) {
	for i := range s {
		s[i] |= o[i]
	}
}

func (s *slotSet) has(slot int) bool { return s[slot/64]&(1<<(slot%64)) != 0 }

func (s *slotSet) empty() bool { return *s == slotSet{} }

// parseSlots reads a notification payload written by outbox.Writer
// ("tenant_1:3,17,200": the writer's schema, then its slots; before
// v0.2.0 the slots alone). ok is false when it is not such a list; the
// relay then probes every slot.
func parseSlots(payload string, into *slotSet) (ok bool) {
	_, payload = splitPayload(payload)
	if payload == "" {
		return false
	}
	for f := range strings.SplitSeq(payload, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n >= slot.Count {
			return false
		}
		into.add(n)
	}
	return true
}

// splitPayload splits a notification payload into the writer's schema
// (before the last ':'; a schema name may hold one, a slot list cannot)
// and the slot list; schema is empty when the payload names none.
func splitPayload(payload string) (schema string, slots string) {
	i := strings.LastIndexByte(payload, ':')
	if i < 0 {
		return "", payload
	}
	return payload[:i], payload[i+1:]
}

// markDirty records slots a notification named, or all slots.
func (r *Relay) markDirty(payload string) {
	r.dirtyMu.Lock()
	defer r.dirtyMu.Unlock()
	if !r.dirtyAll && !parseSlots(payload, &r.dirty) {
		r.dirtyAll = true
	}
}

// markSlots records slots the watch found rows in.
func (r *Relay) markSlots(slots []int32) {
	r.dirtyMu.Lock()
	defer r.dirtyMu.Unlock()
	for _, s := range slots {
		if s >= 0 && s < slot.Count {
			r.dirty.add(int(s))
		}
	}
}

func (r *Relay) markAllDirty() {
	r.dirtyMu.Lock()
	r.dirtyAll = true
	r.dirtyMu.Unlock()
}

// takeDirty returns and clears the slots notifications named since the last
// call; all is true when any notification could not be narrowed down.
func (r *Relay) takeDirty() (s slotSet, all bool) {
	r.dirtyMu.Lock()
	defer r.dirtyMu.Unlock()
	s, all = r.dirty, r.dirtyAll
	r.dirty, r.dirtyAll = slotSet{}, false
	return s, all
}
