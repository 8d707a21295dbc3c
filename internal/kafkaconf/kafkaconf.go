// Package kafkaconf builds the sarama client configuration pgbox's binary and
// examples share from operator settings: version, timeouts, SASL (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512) and TLS. Secrets never appear in what
// Redacted returns.
package kafkaconf

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
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
	kv, err := sarama.ParseKafkaVersion(v)
	if err != nil {
		return kv, fmt.Errorf("must be a Kafka version like 2.8.0 or 3.6.0")
	}
	if !kv.IsAtLeast(sarama.V0_11_0_0) {
		return kv, fmt.Errorf("must be 0.11.0 or newer (the relay's idempotent producer needs it)")
	}
	return kv, nil
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
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: sha256.New} }
		case "SCRAM-SHA-512":
			cfg.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
			cfg.Net.SASL.SCRAMClientGeneratorFunc = func() sarama.SCRAMClient { return &scramClient{hash: sha512.New} }
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

// scramClient implements the client side of SCRAM (RFC 5802) for sarama,
// with SHA-256 or SHA-512. Passwords are used as given (no SASLprep), which
// is exact for ASCII passwords.
type scramClient struct {
	hash func() hash.Hash

	user, password, authz string
	step                  int
	nonce                 string
	clientFirstBare       string
	serverSignature       []byte
	done                  bool
}

func (c *scramClient) Begin(user, password, authz string) error {
	c.user, c.password, c.authz = user, password, authz
	c.step, c.done = 0, false
	return nil
}

func (c *scramClient) Done() bool { return c.done }

func scramEscape(s string) string {
	return strings.NewReplacer("=", "=3D", ",", "=2C").Replace(s)
}

func (c *scramClient) gs2Header() string {
	if c.authz == "" {
		return "n,,"
	}
	return "n,a=" + scramEscape(c.authz) + ","
}

func (c *scramClient) Step(challenge string) (string, error) {
	c.step++
	switch c.step {
	case 1:
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("scram: nonce: %w", err)
		}
		c.nonce = base64.RawStdEncoding.EncodeToString(b)
		c.clientFirstBare = "n=" + scramEscape(c.user) + ",r=" + c.nonce
		return c.gs2Header() + c.clientFirstBare, nil
	case 2:
		attrs := scramAttrs(challenge)
		if e, ok := attrs["e"]; ok {
			return "", fmt.Errorf("scram: server error %q", e)
		}
		nonce, salt64, iter := attrs["r"], attrs["s"], attrs["i"]
		if !strings.HasPrefix(nonce, c.nonce) || len(nonce) == len(c.nonce) {
			return "", errors.New("scram: server nonce does not extend the client nonce")
		}
		salt, err := base64.StdEncoding.DecodeString(salt64)
		if err != nil {
			return "", fmt.Errorf("scram: bad salt: %w", err)
		}
		n, err := strconv.Atoi(iter)
		if err != nil || n < 1 {
			return "", fmt.Errorf("scram: bad iteration count %q", iter)
		}
		size := c.hash().Size()
		salted, err := pbkdf2.Key(c.hash, c.password, salt, n, size)
		if err != nil {
			return "", fmt.Errorf("scram: %w", err)
		}
		clientKey := c.hmac(salted, "Client Key")
		h := c.hash()
		h.Write(clientKey)
		storedKey := h.Sum(nil)
		finalNoProof := "c=" + base64.StdEncoding.EncodeToString([]byte(c.gs2Header())) + ",r=" + nonce
		authMessage := c.clientFirstBare + "," + challenge + "," + finalNoProof
		sig := c.hmac(storedKey, authMessage)
		proof := make([]byte, len(clientKey))
		for i := range clientKey {
			proof[i] = clientKey[i] ^ sig[i]
		}
		serverKey := c.hmac(salted, "Server Key")
		c.serverSignature = c.hmac(serverKey, authMessage)
		return finalNoProof + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
	case 3:
		attrs := scramAttrs(challenge)
		if e, ok := attrs["e"]; ok {
			return "", fmt.Errorf("scram: authentication failed: %s", e)
		}
		v, err := base64.StdEncoding.DecodeString(attrs["v"])
		if err != nil || !hmac.Equal(v, c.serverSignature) {
			return "", errors.New("scram: the server's signature does not match (wrong server or man in the middle)")
		}
		c.done = true
		return "", nil
	}
	return "", errors.New("scram: unexpected extra step")
}

func (c *scramClient) hmac(key []byte, msg string) []byte {
	m := hmac.New(c.hash, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func scramAttrs(s string) map[string]string {
	out := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		if len(part) >= 2 && part[1] == '=' {
			out[part[:1]] = part[2:]
		}
	}
	return out
}
