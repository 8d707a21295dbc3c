package relay_test

import (
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/relay"
)

// The vectors of Kafka's own UtilsTest.testMurmur2.
func TestMurmur2MatchesKafka(t *testing.T) {
	t.Parallel()
	cases := map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	}
	for in, want := range cases {
		require.Equal(t, want, int32(relay.Murmur2([]byte(in))), in)
	}
}

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
