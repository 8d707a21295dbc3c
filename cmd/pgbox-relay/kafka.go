package main

import (
	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/internal/kafkaconf"
)

// The Kafka client settings are kafkaconf.Options, shared with the examples;
// kafkaOptions (options.go) has the same fields, in the same order.

func (k kafkaOptions) conf() kafkaconf.Options { return kafkaconf.Options(k) }

// saramaConfig builds the client configuration every Kafka client of the
// binary shares: version, timeouts, SASL and TLS.
func (k kafkaOptions) saramaConfig() (*sarama.Config, error) { return k.conf().Sarama() }

// redacted describes the Kafka settings for logs, without the password.
func (k kafkaOptions) redacted() string { return k.conf().Redacted() }

func parseKafkaVersion(v string) (sarama.KafkaVersion, error) { return kafkaconf.ParseVersion(v) }
