package cleanup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/cleanup/cleanupsarama"
	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

type testBundle struct {
	db      *testdb.DB
	cluster *kfake.Cluster
	sadmin  sarama.ClusterAdmin // the client
	admin   Admin               // the cleaner's view of it
}

// setup gives a migrated schema, a broker and an admin client for it.
func setup(t *testing.T) *testBundle {
	t.Helper()
	db := testdb.New(t)
	cluster := kafkatest.New(t)
	cfg := kafkatest.Config()
	cfg.Net.ReadTimeout = 3 * time.Second
	cfg.Admin.Retry.Max = 0
	admin, err := sarama.NewClusterAdmin(cluster.ListenAddrs(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	return &testBundle{db: db, cluster: cluster, sadmin: admin, admin: cleanupsarama.New(admin)}
}

func (b *testBundle) topic(t *testing.T, name string, configs map[string]string) {
	t.Helper()
	cfg := map[string]*string{}
	for k, v := range configs {
		cfg[k] = &v
	}
	kafkatest.CreateTopic(t, b.cluster.ListenAddrs(), name, 1, cfg)
}

func (b *testBundle) cleaner(t *testing.T, cfg Config) *Cleaner {
	t.Helper()
	if cfg.Pool == nil {
		cfg.Pool = b.db.Pool
	}
	if cfg.Admin == nil {
		cfg.Admin = b.admin
	}
	c, err := New(cfg)
	require.NoError(t, err)
	return c
}

// insertKey inserts one inbox row with chosen times and an unknown position
// (as written before migration 00070): the time rule decides it.
func (b *testBundle) insertKey(t *testing.T, topic, key string, received time.Time, record *time.Time) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", record_at, received_at, position_at)
		 VALUES ('svc', $2 || '/' || $1, $2, 0, 0, $3, $4, NULL)`, key, topic, record, received)
	require.NoError(t, err)
}

// insertAt inserts one inbox row whose last-seen copy is at (topic,
// partition, offset), position known as the inbox records it, received at
// received: the exact rule decides it.
func (b *testBundle) insertAt(t *testing.T, topic, key string, partition int32, offset int64, received time.Time) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		 VALUES ('svc', $2 || '/' || $1, $2, $3, $4, $5, $5)`, key, topic, partition, offset, received)
	require.NoError(t, err)
}

// bulkKeys inserts n keys of topic received at received, positions unknown.
func (b *testBundle) bulkKeys(t *testing.T, topic string, n int, received time.Time) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO pgbox_inbox (consumer, key, topic, partition, "offset", received_at, position_at)
		 SELECT 'svc', $1 || '-' || $3::timestamptz::text || '-' || g, $1, 0, g, $3::timestamptz, NULL FROM generate_series(1, $2) g`, topic, n, received)
	require.NoError(t, err)
}

// keys returns the keys left of topic, sorted.
func (b *testBundle) keys(t *testing.T, topic string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		`SELECT substr(key, length(topic) + 2) FROM pgbox_inbox WHERE topic = $1 ORDER BY key`, topic)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		out = append(out, k)
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *testBundle) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbox_inbox`).Scan(&n))
	return n
}

func fixedNow() time.Time {
	// Microsecond precision, like timestamptz.
	return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
}

func ms(d time.Duration) string { return fmt.Sprint(d.Milliseconds()) }

func ptr[T any](v T) *T { return &v }

func requireSameTime(t *testing.T, want, got time.Time, msgAndArgs ...any) {
	t.Helper()
	require.True(t, want.Equal(got), "want %v, got %v (%s)", want, got, fmt.Sprint(msgAndArgs...))
}
