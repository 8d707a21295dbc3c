package relay

import (
	"math/rand/v2"

	"github.com/IBM/sarama"
)

// NewMurmur2Partitioner returns a sarama partitioner that places keyed records
// exactly as the Java client's default partitioner does:
// toPositive(murmur2(key)) % partitions. Records without a key go to a random
// partition. It is the relay's default (Config.Partitioner).
func NewMurmur2Partitioner(topic string) sarama.Partitioner { return murmur2Partitioner{} }

type murmur2Partitioner struct{}

func (murmur2Partitioner) Partition(m *sarama.ProducerMessage, n int32) (int32, error) {
	if m.Key == nil {
		return rand.Int32N(n), nil
	}
	key, err := m.Key.Encode()
	if err != nil {
		return -1, err
	}
	return int32(murmur2(key)&0x7fffffff) % n, nil
}

// RequiresConsistency tells sarama that a key's partition must not change
// while retrying.
func (murmur2Partitioner) RequiresConsistency() bool { return true }

// murmur2 is Kafka's murmur2 hash (org.apache.kafka.common.utils.Utils.murmur2),
// returned as the Java int's bits.
func murmur2(data []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	n := len(data)
	h := uint32(seed) ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := n &^ 3
	switch n % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
