// Package kafkaconf builds the sarama client configuration pgbox's binary and
// examples share from operator settings: version, timeouts, SASL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512) and TLS. Secrets never appear in what
// Redacted returns.
package kafkaconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// Options are the Kafka client settings (flags/env of the binary).
type Options struct {
	Brokers       []string
	Version       string
	ClientID      string
	Timeout       time.Duration
	SASLMechanism string
	SASLUser      string
	SASLPassword  string
	TLS           bool
	TLSCA         string
	TLSCert       string
	TLSKey        string
	TLSSkipVerify bool
}

// ParseVersion parses a Kafka version that the relay's idempotent producer
// can use (0.11.0 or newer).
func ParseVersion(v string) (sarama.KafkaVersion, error) {
	kv, err := sarama.ParseKafkaVersion(normalVersion(v))
	if err != nil {
		return kv, fmt.Errorf("must be a Kafka version like 0.11.0, 2.8, 2.8.0 or 3.6.1")
	}
	if !kv.IsAtLeast(sarama.V0_11_0_0) {
		return kv, fmt.Errorf("must be 0.11.0 or newer (the relay's idempotent producer needs it)")
	}
	return kv, nil
}

// normalVersion writes a Kafka version the way users write it (0.11,
// 0.11.0, 0.11.0.2, 2.8, 2.8.1, v3.6.0, 3.6-IV2 as in
// inter.broker.protocol.version) in the form sarama parses: four numbers
// before 1.0 (0.11.0.0), three from 1.0 on (2.8.0).
func normalVersion(v string) string {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if base, iv, ok := strings.Cut(v, "-IV"); ok && iv != "" {
		v = base
	}
	parts := strings.Split(v, ".")
	want := 3
	if parts[0] == "0" {
		want = 4
	}
	for len(parts) < want && len(parts) >= 2 {
		parts = append(parts, "0")
	}
	return strings.Join(parts, ".")
}

// Sarama builds the client configuration every Kafka client of the
// binary shares: version, timeouts, SASL and TLS. Callers add producer or
// consumer settings on top.
func (k Options) Sarama() (*sarama.Config, error) {
	cfg := sarama.NewConfig()
	v, err := ParseVersion(k.Version)
	if err != nil {
		return nil, fmt.Errorf("kafka version %q: %w", k.Version, err)
	}
	cfg.Version = v
	cfg.ClientID = k.ClientID
	cfg.Net.DialTimeout = k.Timeout
	cfg.Net.ReadTimeout = max(k.Timeout, 10*time.Second)
	cfg.Net.WriteTimeout = max(k.Timeout, 10*time.Second)
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	cfg.Admin.Timeout = k.Timeout

	if k.SASLMechanism != "" {
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Handshake = true
		cfg.Net.SASL.User = k.SASLUser
		cfg.Net.SASL.Password = k.SASLPassword
		switch k.SASLMechanism {
		case "PLAIN":
			cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		case "SCRAM-SHA-256":
			cfg.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
			cfg.Net.SASL.SCRAMClientGeneratorFunc = newSCRAMClientFunc(k.SASLMechanism, scram.SHA256)
		case "SCRAM-SHA-512":
			cfg.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			cfg.Net.SASL.SCRAMClientGeneratorFunc = newSCRAMClientFunc(k.SASLMechanism, scram.SHA512)
		default:
			return nil, fmt.Errorf("kafka SASL mechanism %q: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", k.SASLMechanism)
		}
	}

	if k.TLS || k.TLSCA != "" || k.TLSCert != "" || k.TLSSkipVerify {
		tc, err := k.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = tc
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka client config: %w", err)
	}
	return cfg, nil
}

func (k Options) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: k.TLSSkipVerify} //nolint:gosec // operator's explicit choice
	if k.TLSCA != "" {
		pem, err := os.ReadFile(k.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("kafka TLS CA (--kafka-tls-ca): %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafka TLS CA (--kafka-tls-ca) %s: no PEM certificate found", k.TLSCA)
		}
		tc.RootCAs = pool
	}
	if k.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(k.TLSCert, k.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("kafka TLS client certificate (--kafka-tls-cert, --kafka-tls-key): %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// ConnectError names what a failed connection to brokers used: the
// brokers, the SASL mechanism and user, and TLS; never the password. A
// broker refuses a SASL login with SASL_AUTHENTICATION_FAILED, or (kfake,
// some proxies) just closes the connection, which sarama reports as EOF:
// with SASL on, both get a hint to check the credentials.
func ConnectError(brokers []string, cfg *sarama.Config, err error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka brokers %s", strings.Join(brokers, ","))
	var with []string
	if cfg.Net.SASL.Enable {
		with = append(with, fmt.Sprintf("SASL %s as user %q", cfg.Net.SASL.Mechanism, cfg.Net.SASL.User))
	}
	if cfg.Net.TLS.Enable {
		with = append(with, "TLS")
	}
	if len(with) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(with, ", "))
	}
	if cfg.Net.SASL.Enable && (errors.Is(err, sarama.ErrSASLAuthenticationFailed) || errors.Is(err, io.EOF)) {
		b.WriteString(": login refused or connection closed: check the SASL mechanism, user and password")
	}
	return fmt.Errorf("%s: %w", b.String(), err)
}

// Redacted describes the Kafka settings for logs, without the password.
func (k Options) Redacted() string {
	var b strings.Builder
	fmt.Fprintf(&b, "brokers=%s version=%s", strings.Join(k.Brokers, ","), k.Version)
	if k.SASLMechanism != "" {
		fmt.Fprintf(&b, " sasl=%s user=%s password=(redacted)", k.SASLMechanism, k.SASLUser)
	}
	if k.TLS || k.TLSCA != "" || k.TLSCert != "" || k.TLSSkipVerify {
		fmt.Fprintf(&b, " tls=true ca=%q cert=%q skip_verify=%t", k.TLSCA, k.TLSCert, k.TLSSkipVerify)
	}
	return b.String()
}

// scramClient adapts github.com/xdg-go/scram (nonce, proof, the server's
// signature check, a 4096 minimum iteration count) to sarama.SCRAMClient.
// Sarama makes one per authentication attempt.
//
// The user name and password are used as given, not SASLprep'd: Kafka
// brokers derive a SCRAM credential from the password's UTF-8 bytes
// (ScramFormatter.normalize does no SASLprep), and so do the Java client and
// franz-go. SASLprep would change or reject some passwords those accept
// (decomposed accents, non-breaking spaces, emoji), and then a password that
// works everywhere else would fail here.
type scramClient struct {
	mechanism string
	hash      scram.HashGeneratorFcn
	user      string
	conv      *scram.ClientConversation
}

func newSCRAMClientFunc(mechanism string, hash scram.HashGeneratorFcn) func() sarama.SCRAMClient {
	return func() sarama.SCRAMClient { return &scramClient{mechanism: mechanism, hash: hash} }
}

// Begin starts a conversation. The password stays inside the scram.Client;
// no error of this type ever contains it.
func (c *scramClient) Begin(user, password, authzID string) error {
	c.user = user
	cl, err := c.hash.NewClientUnprepped(user, password, authzID)
	if err != nil {
		return c.wrap(err)
	}
	c.conv = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) {
	if c.conv == nil {
		return "", c.wrap(fmt.Errorf("step before begin"))
	}
	resp, err := c.conv.Step(challenge)
	if err != nil {
		return "", c.wrap(err)
	}
	return resp, nil
}

func (c *scramClient) Done() bool { return c.conv != nil && c.conv.Done() }

func (c *scramClient) wrap(err error) error {
	return fmt.Errorf("kafka SASL %s as user %q: %w", c.mechanism, c.user, err)
}
