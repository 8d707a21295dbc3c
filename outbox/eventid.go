package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// EventID is a row's stable, unique event id: a UUIDv7 (RFC 9562) whose first
// 48 bits are the Unix time in milliseconds, so ids sort by creation time.
// The relay sends it as a record header; downstream consumers dedupe on it.
type EventID [16]byte

// String formats id as a canonical lowercase UUID.
func (id EventID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// Time returns the millisecond timestamp embedded in id.
func (id EventID) Time() time.Time {
	ms := int64(id[0])<<40 | int64(id[1])<<32 | int64(id[2])<<24 | int64(id[3])<<16 | int64(id[4])<<8 | int64(id[5])
	return time.UnixMilli(ms)
}

// idGen makes UUIDv7s that are strictly increasing within this process: the
// 12-bit rand_a field is a counter seeded randomly each millisecond (RFC 9562
// §6.2 method 1); when it overflows, the timestamp is advanced by one.
type idGen struct {
	mu      sync.Mutex
	lastMS  int64
	counter uint16
}

var ids idGen

func (g *idGen) fill(out []EventID) {
	// One read of randomness for all ids: 8 bytes each for rand_b, 2 for seeding.
	buf := make([]byte, len(out)*8+2)
	if _, err := rand.Read(buf); err != nil {
		panic("outbox: crypto/rand: " + err.Error()) // never fails on supported platforms
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now().UnixMilli()
	if now > g.lastMS {
		g.lastMS = now
		g.counter = (uint16(buf[len(buf)-2])<<8 | uint16(buf[len(buf)-1])) & 0x3ff // leave headroom to count up
	}
	for i := range out {
		g.counter++
		if g.counter > 0xfff {
			g.lastMS++
			g.counter = 0
		}
		ms := g.lastMS
		id := &out[i]
		id[0], id[1], id[2], id[3], id[4], id[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
		id[6] = 0x70 | byte(g.counter>>8)&0x0f // version 7
		id[7] = byte(g.counter)
		copy(id[8:], buf[i*8:i*8+8])
		id[8] = id[8]&0x3f | 0x80 // variant 10
	}
}

// NewEventID returns a fresh UUIDv7, later than every id this process made before.
func NewEventID() EventID {
	var out [1]EventID
	ids.fill(out[:])
	return out[0]
}
