// Package kafkatest runs the embedded Kafka-protocol broker (kfake) for tests and
// gives sarama clients tuned for it. Only tests and cmd/ may import it: library
// packages never depend on the embedded broker.
package kafkatest

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Version is the Kafka protocol version sarama clients announce to kfake.
var Version = sarama.V3_6_0_0

// New starts a one-broker cluster on a loopback port, closed when the test ends.
// Extra kfake options (SeedTopics, faults, SASL...) pass through.
func New(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kafkatest: start broker: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Config returns a sarama config suited to kfake: the protocol version set,
// short timeouts and backoffs so failures surface quickly in tests.
func Config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = Version
	cfg.ClientID = "pgbox-test"
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	cfg.Metadata.RefreshFrequency = time.Second
	cfg.Producer.Retry.Backoff = 50 * time.Millisecond
	cfg.Consumer.Retry.Backoff = 50 * time.Millisecond
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Net.DialTimeout = 2 * time.Second
	return cfg
}

// CreateTopic creates topic with the given partitions and topic configs.
func CreateTopic(t testing.TB, addrs []string, topic string, partitions int32, configs map[string]*string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(addrs, Config())
	if err != nil {
		t.Fatalf("kafkatest: admin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: configs}, false); err != nil {
		t.Fatalf("kafkatest: create topic %s: %v", topic, err)
	}
}

// ReadAll consumes topic from the oldest offset of every partition until it has
// at least want records or timeout passes, and returns what it read ordered by
// (partition, offset). It fails the test only on client errors; callers assert
// on the count.
func ReadAll(t testing.TB, addrs []string, topic string, want int, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	client, err := sarama.NewClient(addrs, Config())
	if err != nil {
		t.Fatalf("kafkatest: client: %v", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatalf("kafkatest: consumer: %v", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("kafkatest: partitions of %s: %v", topic, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out := make(chan *sarama.ConsumerMessage, 1024)
	for _, p := range parts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("kafkatest: consume %s/%d: %v", topic, p, err)
		}
		defer pc.Close()
		go func() {
			for {
				select {
				case m, ok := <-pc.Messages():
					if !ok {
						return
					}
					select {
					case out <- m:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	var got []*sarama.ConsumerMessage
	for len(got) < want {
		select {
		case m := <-out:
			got = append(got, m)
		case <-ctx.Done():
			sortRecords(got)
			return got
		}
	}
	// Linger briefly so extra records (duplicates) are seen too.
	linger := time.After(200 * time.Millisecond)
	for {
		select {
		case m := <-out:
			got = append(got, m)
		case <-linger:
			sortRecords(got)
			return got
		case <-ctx.Done():
			sortRecords(got)
			return got
		}
	}
}

func sortRecords(ms []*sarama.ConsumerMessage) {
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].Partition != ms[j].Partition {
			return ms[i].Partition < ms[j].Partition
		}
		return ms[i].Offset < ms[j].Offset
	})
}
