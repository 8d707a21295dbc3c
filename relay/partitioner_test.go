package relay_test

import (
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/relay"
)

// The partitioner places keys where franz-go's Kafka-compatible (Java
// default) partitioner does.
func TestMurmur2PartitionerMatchesJavaClient(t *testing.T) {
	t.Parallel()
	p := relay.NewMurmur2Partitioner("t")
	require.True(t, p.RequiresConsistency())
	ref := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for _, n := range []int32{1, 3, 7, 64} {
		for i := range 500 {
			key := fmt.Appendf(nil, "order-%d", i*7919)
			got, err := p.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(key)}, n)
			require.NoError(t, err)
			require.Equal(t, int32(ref.Partition(&kgo.Record{Key: key}, int(n))), got, "key %s, %d partitions", key, n)
		}
	}
	got, err := p.Partition(&sarama.ProducerMessage{}, 5)
	require.NoError(t, err)
	require.True(t, got >= 0 && got < 5)
}
