package main

import (
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/internal/slot"
	"github.com/pgbox/pgbox/outbox"
	"github.com/pgbox/pgbox/relay"
)

// relayOptions are the relay's settings; their defaults are the relay
// package's.
type relayOptions struct {
	Lanes             int
	Instance          string
	BatchSize         int
	PollInterval      time.Duration
	HeartbeatInterval time.Duration
	LeaseTTL          time.Duration
	MaxAttempts       int
	UnknownTopicWait  time.Duration
	KafkaOutageAlert  time.Duration
	SweepInterval     time.Duration
	MaxBackoff        time.Duration
	NoListen          bool
	Channel           string
	Partitioner       string
	MaxMessageBytes   int
	bound             bool
}

func (r *relayOptions) bind(s *settings) {
	r.bound = true
	g := groupRelay
	s.integer(&r.Lanes, g, "lanes", "PGBOX_LANES", relay.LanesDefault, 1, slot.Count,
		"lanes the outbox is split into; each is published by one instance at a time (the same on every instance)")
	s.str(&r.Instance, g, "instance", "PGBOX_INSTANCE", "", "this instance's name in the lease tables, to which a random suffix is added (empty: hostname-pid)")
	s.integer(&r.BatchSize, g, "batch-size", "PGBOX_BATCH_SIZE", relay.BatchSizeDefault, 1, 100_000, "most rows one pass claims and sends")
	s.duration(&r.PollInterval, g, "poll-interval", "PGBOX_POLL_INTERVAL", relay.PollIntervalDefault, time.Millisecond,
		"how often an idle relay looks for rows when no NOTIFY wakes it")
	s.duration(&r.HeartbeatInterval, g, "heartbeat-interval", "PGBOX_HEARTBEAT_INTERVAL", relay.HeartbeatIntervalDefault, time.Millisecond,
		"how often leases are renewed and lanes rebalanced")
	s.duration(&r.LeaseTTL, g, "lease-ttl", "PGBOX_LEASE_TTL", relay.LeaseTTLDefault, time.Millisecond,
		"lane lease length; a dead instance's lanes move within lease-ttl + heartbeat-interval (at least 2 × heartbeat-interval)")
	s.integer(&r.MaxAttempts, g, "max-attempts", "PGBOX_MAX_ATTEMPTS", relay.MaxAttemptsDefault, 1, 1000,
		"permanent publish failures (too large, rejected) before a row is parked; broker outages never count")
	s.duration(&r.UnknownTopicWait, g, "unknown-topic-window", "PGBOX_UNKNOWN_TOPIC_WINDOW", relay.UnknownTopicWindowDefault, 0,
		"how long a row whose topic does not exist is retried before it is parked (0: parked after max-attempts)")
	s.duration(&r.KafkaOutageAlert, g, "kafka-outage-alert", "PGBOX_KAFKA_OUTAGE_ALERT", relay.KafkaOutageAlertDefault, time.Millisecond,
		"how long Kafka may be unreachable before the relay logs it at ERROR (status shows it from the start)")
	s.duration(&r.SweepInterval, g, "sweep-interval", "PGBOX_SWEEP_INTERVAL", relay.SweepIntervalDefault, time.Millisecond,
		"how often the relay looks below every owned slot's floor, the floor's second line of defence: a committed row found there is published, counted and logged at ERROR")
	s.duration(&r.MaxBackoff, g, "max-backoff", "PGBOX_MAX_BACKOFF", relay.MaxBackoffDefault, time.Millisecond, "cap of the backoff after failed passes")
	s.boolean(&r.NoListen, g, "no-listen", "PGBOX_NO_LISTEN", false, "poll only, no LISTEN (needed behind pgbouncer in transaction mode)")
	s.str(&r.Channel, g, "channel", "PGBOX_CHANNEL", outbox.ChannelDefault, "LISTEN channel; must match the writers' outbox.Config.Channel")
	s.enum(&r.Partitioner, g, "partitioner", "PGBOX_PARTITIONER", "murmur2",
		"key→partition hash: murmur2 (the Java client's) or fnv1a (sarama's default)", "murmur2", "fnv1a")
	s.integer(&r.MaxMessageBytes, g, "kafka-max-message-bytes", "PGBOX_KAFKA_MAX_MESSAGE_BYTES", relay.MaxMessageBytesDefault, 1024, 1<<30,
		"largest record (outbox.RecordSize, pgbox's headers and overhead included) the relay publishes; equal to the writers' outbox.Config.MaxBytes, at most the brokers' message.max.bytes")
}

func (r *relayOptions) validate() error {
	if !r.bound {
		return nil
	}
	if r.LeaseTTL < 2*r.HeartbeatInterval {
		return usageError("PGBOX_LEASE_TTL (--lease-ttl) %s is less than twice PGBOX_HEARTBEAT_INTERVAL (--heartbeat-interval) %s: a lease must survive one missed heartbeat",
			fmtDuration(r.LeaseTTL), fmtDuration(r.HeartbeatInterval))
	}
	if len(r.Channel) == 0 || len(r.Channel) > 63 {
		return usageError("invalid value %q for PGBOX_CHANNEL (--channel): must be 1 to 63 bytes", r.Channel)
	}
	return nil
}

// relayKafkaConfig is the relay's producer config: the relay package's
// producer settings (WaitForAll acks, retries) on top of the binary's client settings.
func relayKafkaConfig(k kafkaOptions, maxMessageBytes int) (*sarama.Config, error) {
	base, err := k.Sarama()
	if err != nil {
		return nil, err
	}
	c := relay.NewKafkaConfig()
	c.Version = base.Version
	c.ClientID = base.ClientID
	c.Net = base.Net
	c.Net.MaxOpenRequests = 1
	c.Metadata = base.Metadata
	c.Producer.MaxMessageBytes = maxMessageBytes
	return c, nil
}

// relayConfig maps the settings onto relay.Config.
func (a *app) relayConfig(pool *pgxpool.Pool) (relay.Config, error) {
	o := a.opts
	kc, err := relayKafkaConfig(o.Kafka, o.Relay.MaxMessageBytes)
	if err != nil {
		return relay.Config{}, err
	}
	part := relay.NewMurmur2Partitioner
	if o.Relay.Partitioner == "fnv1a" {
		part = sarama.NewHashPartitioner
	}
	unknownTopic := o.Relay.UnknownTopicWait
	if unknownTopic == 0 { // an explicit 0s: park at max-attempts
		unknownTopic = relay.NoUnknownTopicWindow
	}
	return relay.Config{
		Pool:               pool,
		Brokers:            o.Kafka.Brokers,
		Kafka:              kc,
		Partitioner:        part,
		Lanes:              o.Relay.Lanes,
		Instance:           o.Relay.Instance,
		BatchSize:          o.Relay.BatchSize,
		PollInterval:       o.Relay.PollInterval,
		HeartbeatInterval:  o.Relay.HeartbeatInterval,
		LeaseTTL:           o.Relay.LeaseTTL,
		MaxAttempts:        o.Relay.MaxAttempts,
		UnknownTopicWindow: unknownTopic,
		KafkaOutageAlert:   o.Relay.KafkaOutageAlert,
		SweepInterval:      o.Relay.SweepInterval,
		MaxBackoff:         o.Relay.MaxBackoff,
		MaxMessageBytes:    o.Relay.MaxMessageBytes,
		NoListen:           o.Relay.NoListen,
		Channel:            o.Relay.Channel,
		StopTimeout:        stopTimeout(o.ShutdownTimeout),
		Logger:             a.log.With("component", "relay"),
	}, nil
}

// stopTimeout leaves part of the shutdown deadline for releasing lanes and
// closing connections after the relay's in-flight send.
func stopTimeout(shutdown time.Duration) time.Duration {
	return max(shutdown*2/3, min(shutdown, 100*time.Millisecond))
}
