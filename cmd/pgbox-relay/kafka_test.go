package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
)

// listTopics connects with the binary's own client config and lists topics:
// it succeeds only if the connection (TLS handshake, SASL exchange) does.
func listTopics(t *testing.T, k kafkaOptions) error {
	t.Helper()
	cfg, err := k.saramaConfig()
	require.NoError(t, err)
	cfg.Metadata.Retry.Max = 0
	cfg.Net.DialTimeout = 2 * time.Second
	admin, err := sarama.NewClusterAdmin(k.Brokers, cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		return err
	}
	if _, ok := topics["sasl-tls-probe"]; !ok {
		t.Fatalf("connected but topic sasl-tls-probe is missing: %v", topics)
	}
	return nil
}

func baseKafka(addrs []string) kafkaOptions {
	return kafkaOptions{Brokers: addrs, Version: kafkaVersionDefault, ClientID: "pgbox-test", Timeout: 2 * time.Second}
}

func TestKafkaSASL(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser(mech, "alice", "s3cret=,pw"), kfake.SeedTopics(1, "sasl-tls-probe"))
			k := baseKafka(c.ListenAddrs())
			k.SASLMechanism, k.SASLUser, k.SASLPassword = mech, "alice", "s3cret=,pw"
			require.NoError(t, listTopics(t, k), "right password must connect")

			k.SASLPassword = "wrong"
			require.Error(t, listTopics(t, k), "wrong password must be refused")

			k.SASLMechanism, k.SASLUser, k.SASLPassword = "", "", ""
			require.Error(t, listTopics(t, k), "no SASL must be refused by a SASL broker")
		})
	}
}

func TestKafkaTLS(t *testing.T) {
	t.Parallel()
	pki := kafkatest.NewPKI(t)
	c := kafkatest.New(t, kfake.TLS(pki.ServerTLS), kfake.SeedTopics(1, "sasl-tls-probe"))

	k := baseKafka(c.ListenAddrs())
	k.TLSCA, k.TLSCert, k.TLSKey = pki.CAFile, pki.CertFile, pki.KeyFile
	require.NoError(t, listTopics(t, k), "CA + client certificate must connect")

	noCA := k
	noCA.TLSCA = ""
	require.Error(t, listTopics(t, noCA), "the broker's certificate is not signed by a system root")

	noClientCert := baseKafka(c.ListenAddrs())
	noClientCert.TLSCA = pki.CAFile
	require.Error(t, listTopics(t, noClientCert), "the broker requires a client certificate")

	plain := baseKafka(c.ListenAddrs())
	require.Error(t, listTopics(t, plain), "plaintext to a TLS listener must fail")
}

func TestKafkaTLSAndSASL(t *testing.T) {
	t.Parallel()
	pki := kafkatest.NewPKI(t)
	c := kafkatest.New(t, kfake.TLS(pki.ServerTLS), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "bob", "pw"), kfake.SeedTopics(1, "sasl-tls-probe"))
	k := baseKafka(c.ListenAddrs())
	k.TLSCA, k.TLSCert, k.TLSKey = pki.CAFile, pki.CertFile, pki.KeyFile
	k.SASLMechanism, k.SASLUser, k.SASLPassword = "SCRAM-SHA-256", "bob", "pw"
	require.NoError(t, listTopics(t, k))
}

func TestKafkaTLSBadFiles(t *testing.T) {
	t.Parallel()
	k := baseKafka([]string{"127.0.0.1:1"})
	k.TLSCA = filepath.Join(t.TempDir(), "missing.pem")
	_, err := k.saramaConfig()
	require.ErrorContains(t, err, "--kafka-tls-ca")

	junk := filepath.Join(t.TempDir(), "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("not a certificate"), 0o600))
	k.TLSCA = junk
	_, err = k.saramaConfig()
	require.ErrorContains(t, err, "no PEM certificate")
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://alice:hunter2@db:5432/app?sslmode=disable": "postgres://alice:xxxxx@db:5432/app?sslmode=disable",
		"postgres://alice@db/app":                              "postgres://alice@db/app",
		"postgres://db/app?password=hunter2&user=a":            "postgres://db/app?password=xxxxx&user=a",
		"host=db user=alice password=hunter2 dbname=app":       "host=db user=alice password=xxxxx dbname=app",
		"host=db password='hun ter2' dbname=app":               "host=db password=xxxxx dbname=app",
		"":                                                     "",
	} {
		got := redactDSN(in)
		require.Equal(t, want, got, in)
		require.NotContains(t, got, "hunter2")
	}
}
