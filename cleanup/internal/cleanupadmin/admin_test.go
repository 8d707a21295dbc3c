package cleanupadmin_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/pgbox/pgbox/cleanup/cleanupkgo"
	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/cleanup/internal/cleanupadmin"
	"github.com/pgbox/pgbox/internal/kafkatest"
)

// sarama's metrics library keeps one process-wide ticker goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

// impl makes one implementation of cleanupadmin.Admin for a broker.
type impl struct {
	name string
	new  func(t *testing.T, addrs []string) cleanupadmin.Admin
}

var impls = []impl{
	{"sarama", func(t *testing.T, addrs []string) cleanupadmin.Admin {
		cfg := kafkatest.Config()
		cfg.Net.ReadTimeout = 3 * time.Second
		cfg.Admin.Retry.Max = 0
		admin, err := sarama.NewClusterAdmin(addrs, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = admin.Close() })
		return cleanupsarama.New(admin)
	}},
	{"kgo", func(t *testing.T, addrs []string) cleanupadmin.Admin {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RetryTimeout(3*time.Second))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		return cleanupkgo.New(kadm.NewClient(cl))
	}},
}

// TestAdmins: every implementation gives the cleaner the same answers from
// the same broker (one test body, run per Kafka client): topic configs, a
// topic Kafka does not know, each partition's log start offset once
// DeleteRecords moved it, the topic id as Kafka prints it, and an error (not
// a hang) when the broker swallows a request or is gone.
func TestAdmins(t *testing.T) {
	t.Parallel()
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			t.Parallel()
			adminBody(t, im)
		})
	}
}

func adminBody(t *testing.T, im impl) {
	ctx := context.Background()
	cluster := kafkatest.New(t)
	addrs := cluster.ListenAddrs()
	hour, tenMin, compact := "3600000", "600000", "compact"
	kafkatest.CreateTopic(t, addrs, "orders", 3, map[string]*string{"retention.ms": &hour, "segment.ms": &tenMin})
	kafkatest.CreateTopic(t, addrs, "ledger", 1, map[string]*string{"cleanup.policy": &compact})
	produce(t, addrs, "orders", 0, 4)
	sa, err := sarama.NewClusterAdmin(addrs, kafkatest.Config())
	require.NoError(t, err)
	defer func() { _ = sa.Close() }()
	require.NoError(t, sa.DeleteRecords("orders", map[int32]int64{0: 3}))

	admin := im.new(t, addrs)
	names := []string{"retention.ms", "segment.ms", "cleanup.policy"}
	cfgs, err := admin.TopicConfigs(ctx, []string{"orders", "ledger", "ghost"}, names)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"retention.ms": hour, "segment.ms": tenMin, "cleanup.policy": "delete"}, cfgs["orders"].Values)
	require.Equal(t, "compact", cfgs["ledger"].Values["cleanup.policy"])
	require.Len(t, cfgs["ledger"].Values, 3, "only the names asked for")
	require.True(t, cfgs["ghost"].NotFound, "%+v", cfgs["ghost"])

	starts, err := admin.LogStarts(ctx, []string{"orders", "ledger", "ghost"})
	require.NoError(t, err)
	require.Equal(t, map[int32]int64{0: 3, 1: 0, 2: 0}, starts["orders"].Offsets)
	require.Empty(t, starts["orders"].Failed)
	require.Equal(t, map[int32]int64{0: 0}, starts["ledger"].Offsets)
	require.True(t, starts["ghost"].NotFound, "%+v", starts["ghost"])
	meta, err := sa.DescribeTopics([]string{"orders"})
	require.NoError(t, err)
	require.NotEmpty(t, starts["orders"].ID)
	require.Equal(t, meta[0].Uuid.String(), starts["orders"].ID, "the topic id, as Kafka prints it")

	// A broker that swallows the requests: each call ends with ctx.
	for _, key := range []kmsg.Key{kmsg.DescribeConfigs, kmsg.ListOffsets} {
		cluster.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			cluster.KeepControl()
			return nil, nil, true
		})
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = admin.TopicConfigs(short, []string{"orders"}, names)
	require.Error(t, err)
	_, err = admin.LogStarts(short, []string{"orders"})
	require.Error(t, err)
	require.Less(t, time.Since(t0), 5*time.Second)

	// A broker that is gone: errors, not answers.
	cluster.Close()
	gone, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	_, err = admin.TopicConfigs(gone, []string{"orders"}, names)
	require.Error(t, err)
	_, err = admin.LogStarts(gone, []string{"orders"})
	require.Error(t, err)
}

func produce(t *testing.T, addrs []string, topic string, partition int32, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	for range n {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: partition, Value: []byte("v")}).FirstErr())
	}
}
