package inboxfranz_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgbox/pgbox/inbox"
	"github.com/pgbox/pgbox/inbox/inboxfranz"
	"github.com/pgbox/pgbox/internal/testdb"
)

func noop(context.Context, pgx.Tx, inbox.Message) error { return nil }

// Bad input is refused at construction, each error naming the setting to fix.
func TestNewConsumerValidates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ib, err := inbox.New(inbox.Config{Consumer: "svc", Key: inbox.ByOffset()})
	require.NoError(t, err)
	// No broker needs to answer: every check runs before the first request.
	base := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("events")}
	good := append([]kgo.Opt{kgo.ConsumerGroup("svc")}, base...)
	for _, tc := range []struct {
		name string
		mk   func() (*inboxfranz.Consumer, error)
		want string
	}{
		{"nil pool", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(nil, ib, noop, inboxfranz.Config{}, good...)
		}, "nil pool"},
		{"nil inbox", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, nil, noop, inboxfranz.Config{}, good...)
		}, "nil *inbox.Inbox"},
		{"nil handler", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, nil, inboxfranz.Config{}, good...)
		}, "nil HandlerFunc"},
		{"negative attempts", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{MaxAttempts: -1}}, good...)
		}, "Config.MaxAttempts is negative"},
		{"negative batch", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{BatchSize: -1}}, good...)
		}, "Config.BatchSize is negative"},
		{"negative commit interval", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{CommitInterval: -time.Second}, good...)
		}, "Config.CommitInterval is negative"},
		{"bad dlq topic", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{ConsumerConfig: inbox.ConsumerConfig{DeadLetterTopic: "dead letters"}}, good...)
		}, `Config.DeadLetterTopic "dead letters"`},
		{"no group", func() (*inboxfranz.Consumer, error) {
			return inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{}, base...)
		}, "kgo.ConsumerGroup"},
	} {
		c, err := tc.mk()
		require.ErrorContains(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "inboxfranz: ", tc.name)
		require.Nil(t, c, tc.name)
	}
	c, err := inboxfranz.NewConsumer(db.Pool, ib, noop, inboxfranz.Config{}, good...)
	require.NoError(t, err)
	c.Close()
}

func TestMessage(t *testing.T) {
	t.Parallel()
	at := time.Unix(1700000000, 0)
	m := inboxfranz.Message(&kgo.Record{Topic: "t", Partition: 2, Offset: 7, Key: []byte("k"), Value: []byte("v"),
		Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("x")}}, Timestamp: at})
	require.Equal(t, "t", m.Topic)
	require.EqualValues(t, 2, m.Partition)
	require.EqualValues(t, 7, m.Offset)
	require.Equal(t, []byte("k"), m.Key)
	require.Equal(t, []byte("v"), m.Value)
	require.Equal(t, at, m.Timestamp)
	h, ok := m.Header("h")
	require.True(t, ok)
	require.Equal(t, []byte("x"), h)
	require.Equal(t, inbox.Message{}, inboxfranz.Message(nil))
}
