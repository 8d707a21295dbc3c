package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgbox/pgbox/internal/kafkatest"
	"github.com/pgbox/pgbox/internal/testdb"
)

// listTopics connects the way the binary does (its client config, its lazy
// client and the error that names the connection) and lists topics: it
// succeeds only if the connection (TLS handshake, SASL exchange) does.
func listTopics(t *testing.T, k kafkaOptions) error {
	t.Helper()
	cfg, err := k.Sarama()
	require.NoError(t, err)
	cfg.Metadata.Retry.Max = 0
	cfg.Net.DialTimeout = 2 * time.Second
	lk := &lazyKafka{brokers: k.Brokers, cfg: cfg}
	defer lk.Close()
	_, admin, err := lk.connect()
	if err != nil {
		return err
	}
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

var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

// saslBroker starts a broker whose only user is user/password with mech,
// behind mutual TLS when pki is not nil, and returns the binary's Kafka
// options for it (the right password, TLS files set).
func saslBroker(t *testing.T, pki *kafkatest.PKI, mech, user, password string) kafkaOptions {
	t.Helper()
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.Superuser(mech, user, password), kfake.SeedTopics(1, "sasl-tls-probe")}
	if pki != nil {
		opts = append(opts, kfake.TLS(pki.ServerTLS))
	}
	c := kafkatest.New(t, opts...)
	k := baseKafka(c.ListenAddrs())
	k.SASLMechanism, k.SASLUser, k.SASLPassword = mech, user, password
	if pki != nil {
		k.TLSCA, k.TLSCert, k.TLSKey = pki.CAFile, pki.CertFile, pki.KeyFile
	}
	return k
}

// TestKafkaSASL: each mechanism, with and without TLS. The right password
// connects; a wrong password or an unknown user is refused with an error
// that names the mechanism and the user and contains no password.
func TestKafkaSASL(t *testing.T) {
	t.Parallel()
	pki := kafkatest.NewPKI(t)
	const right, wrong = "s3cret=,pw", "wr0ng-pw"
	for _, mech := range saslMechanisms {
		for _, withTLS := range []bool{false, true} {
			name := mech
			var p *kafkatest.PKI
			if withTLS {
				name, p = mech+"+TLS", &pki
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				k := saslBroker(t, p, mech, "alice", right)
				require.NoError(t, listTopics(t, k), "right password must connect")

				k.SASLPassword = wrong
				err := listTopics(t, k)
				require.Error(t, err, "wrong password must be refused")
				requireNamesLogin(t, err, mech, "alice", withTLS, right, wrong)

				k.SASLUser, k.SASLPassword = "mallory", right
				err = listTopics(t, k)
				require.Error(t, err, "unknown user must be refused")
				requireNamesLogin(t, err, mech, "mallory", withTLS, right, wrong)

				k.SASLMechanism, k.SASLUser, k.SASLPassword = "", "", ""
				require.Error(t, listTopics(t, k), "no SASL must be refused by a SASL broker")
			})
		}
	}
}

func requireNamesLogin(t *testing.T, err error, mech, user string, withTLS bool, secrets ...string) {
	t.Helper()
	msg := err.Error()
	require.Contains(t, msg, "SASL "+mech+` as user "`+user+`"`)
	require.Contains(t, msg, "check the SASL mechanism, user and password")
	if withTLS {
		require.Contains(t, msg, ", TLS)")
	}
	for _, s := range secrets {
		require.NotContains(t, msg, s, "a password reached the error")
	}
}

// TestKafkaSASLCredentialsAsGiven: user names and passwords reach the broker
// as given. Kafka derives SCRAM credentials from the password's UTF-8 bytes
// without SASLprep (and so does kfake), so a client that SASLprep'd would
// fail the decomposed accent, the no-break space and the emoji below (NFKC
// changes the first two, SASLprep rejects the third). SCRAM user names are
// ASCII here because kfake's SCRAM parser accepts only ASCII names; they
// carry the two characters SCRAM escapes ("=" and ",").
func TestKafkaSASLCredentialsAsGiven(t *testing.T) {
	t.Parallel()
	const password = "pa\u0308ss\u00a0w\u00f6rd \U0001F511=,"
	for _, mech := range saslMechanisms {
		user := "ops=team,eu"
		if mech == "PLAIN" {
			user = "j\u00fcrgen=,"
		}
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			k := saslBroker(t, nil, mech, user, password)
			require.NoError(t, listTopics(t, k))
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

func TestKafkaTLSBadFiles(t *testing.T) {
	t.Parallel()
	k := baseKafka([]string{"127.0.0.1:1"})
	k.TLSCA = filepath.Join(t.TempDir(), "missing.pem")
	_, err := k.Sarama()
	require.ErrorContains(t, err, "--kafka-tls-ca")

	junk := filepath.Join(t.TempDir(), "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("not a certificate"), 0o600))
	k.TLSCA = junk
	_, err = k.Sarama()
	require.ErrorContains(t, err, "no PEM certificate")
}

// TestRunRefusedLoginLogsNoSecret runs the binary against brokers that
// refuse its login (wrong password), debug logging on: /readyz says which
// mechanism and user were refused, the relay keeps retrying, and no line of
// its output carries either password.
func TestRunRefusedLoginLogsNoSecret(t *testing.T) {
	t.Parallel()
	pki := kafkatest.NewPKI(t)
	const right, wrong = "r1ght-Pa55", "wr0ng-Pa55"
	for _, tc := range []struct {
		mech string
		pki  *kafkatest.PKI
	}{{"PLAIN", nil}, {"SCRAM-SHA-256", &pki}, {"SCRAM-SHA-512", nil}} {
		t.Run(tc.mech, func(t *testing.T) {
			t.Parallel()
			k := saslBroker(t, tc.pki, tc.mech, "alice", right)
			db := testdb.New(t)
			env := append(runEnv(db, kafkatest.New(t)), "KAFKA_BROKERS="+strings.Join(k.Brokers, ","),
				"PGBOX_LOG_LEVEL=debug",
				"PGBOX_KAFKA_SASL_MECHANISM="+tc.mech, "PGBOX_KAFKA_SASL_USER=alice", "PGBOX_KAFKA_SASL_PASSWORD="+wrong)
			if tc.pki != nil {
				env = append(env, "PGBOX_KAFKA_TLS_CA="+k.TLSCA, "PGBOX_KAFKA_TLS_CERT="+k.TLSCert, "PGBOX_KAFKA_TLS_KEY="+k.TLSKey)
			}
			p := startRelay(t, env, "run")
			base := "http://" + p.HTTPAddr(t)
			// /readyz answers within 3s; a slow machine may answer "deadline
			// exceeded" before the broker's refusal is in: ask again.
			var ready readyReport
			var body string
			waitFor(t, "/readyz to report the refused login", time.Minute, func() bool {
				var code int
				code, body = httpGet(t, base+"/readyz")
				require.Equal(t, 503, code, body)
				require.NoError(t, json.Unmarshal([]byte(body), &ready), body)
				return strings.Contains(ready.Kafka, "SASL "+tc.mech+` as user "alice"`)
			})
			require.Contains(t, ready.Kafka, "check the SASL mechanism, user and password")
			waitFor(t, "the relay to log a failed connection", time.Minute, func() bool {
				return strings.Contains(p.Output(), "connect to Kafka failed")
			})
			require.Equal(t, 0, p.stop(t), p.Output())
			out := p.Output() + body
			require.Contains(t, out, "kafka_sasl_password=(redacted)")
			require.NotContains(t, out, right)
			require.NotContains(t, out, wrong)
		})
	}
}
