package relay

import (
	"errors"

	"github.com/IBM/sarama"
)

// The relay's Kafka error classes, in one table: for each error a send can
// meet, what the relay does about it and why. franz-go's kerr keeps
// retriability on the error itself; sarama's KError does not, so the relay
// keeps it here. A send error goes through three questions, in the order
// the send meets them:
//
//  1. Within the send: is the same record batch sent again (same producer
//     id and sequence, so the broker drops it if the first try was written),
//     up to Producer.Retry.Max times after a metadata refresh (retry)? Must
//     the producer id change first (newID)? Does the broker reject what the
//     batch holds, so its rows are sent one per batch to find the bad one
//     (split)?
//  2. After the send: what happens to the row (fate)? Transient errors
//     leave it for the next pass and never count; permanent ones count an
//     attempt and park the row at MaxAttempts; a missing topic is the
//     two-stage rule: retried with backoff for UnknownTopicWindow from the
//     row's first failure (a deploy often writes before it creates its
//     topic), then parked.
//  3. Either way, a failed or parked row holds its key's later rows.
//
// An error not in the table (a broken connection, a timeout of the request
// as a whole, anything new) is transient: the row is never parked for what
// time may fix.

// fate is what happens to a row whose send failed, once the send is over.
type fate int

const (
	// fateTransient: the row waits for the next pass; attempts do not count.
	fateTransient fate = iota
	// fatePermanent: attempts + 1; parked at MaxAttempts.
	fatePermanent
	// fateMissingTopic: attempts + 1; parked once UnknownTopicWindow has
	// passed since the row's first failure (NoUnknownTopicWindow: as
	// fatePermanent).
	fateMissingTopic
)

// kafkaRule is one row of the table.
type kafkaRule struct {
	err   error // a sarama.KError, or the kind of error matched by errors.Is/As
	retry bool  // send the same batch again within the send
	newID bool  // take a new producer id before sending again
	split bool  // the broker rejects the batch's content: one row per batch
	fate  fate
	why   string
}

// kafkaRules is the table. UNKNOWN_TOPIC_OR_PARTITION is both retried
// within the send (metadata may lag a topic just created, or a partition
// whose leader moved) and, once retries are spent, a missing topic.
var kafkaRules = []kafkaRule{
	{err: sarama.ErrLeaderNotAvailable, retry: true, why: "a leader election is under way"},
	{err: sarama.ErrNotLeaderForPartition, retry: true, why: "the leader moved; metadata is refreshed"},
	{err: sarama.ErrRequestTimedOut, retry: true, why: "the broker did not get the acks in time; the retry is deduplicated by its sequence"},
	{err: sarama.ErrNotEnoughReplicas, retry: true, why: "too few in-sync replicas for acks=all, for now"},
	{err: sarama.ErrNotEnoughReplicasAfterAppend, retry: true, why: "written but not replicated enough; the retry is deduplicated"},
	{err: sarama.ErrKafkaStorageError, retry: true, why: "a disk of the leader failed; the partition moves"},
	{err: sarama.ErrBrokerNotAvailable, retry: true, why: "the broker is down"},
	{err: sarama.ErrNetworkException, retry: true, why: "the connection broke"},
	{err: sarama.ErrOutOfBrokers, why: "no broker answers; the producer reconnects before the next pass"},
	{err: sarama.ErrOutOfOrderSequenceNumber, retry: true, newID: true, why: "the broker lost track of the sequence; a new producer id starts over"},
	{err: sarama.ErrUnknownProducerID, retry: true, newID: true, why: "the broker expired the producer id"},
	{err: sarama.ErrInvalidProducerEpoch, retry: true, newID: true, why: "another producer took over the id"},
	{err: sarama.ErrUnknownTopicOrPartition, retry: true, fate: fateMissingTopic,
		why: "the topic does not exist (auto-creation off), or not yet: retried for UnknownTopicWindow, then parked"},
	{err: sarama.ErrMessageSizeTooLarge, split: true, fate: fatePermanent, why: "a record is larger than the topic's max.message.bytes"},
	{err: sarama.ErrMessageSetSizeTooLarge, split: true, fate: fatePermanent, why: "the batch is larger than the broker takes"},
	{err: sarama.ErrInvalidRecord, split: true, fate: fatePermanent, why: "the broker refuses a record (e.g. no key on a compacted topic)"},
	{err: sarama.ErrPolicyViolation, split: true, fate: fatePermanent, why: "a broker policy refuses a record"},
	{err: sarama.ErrInvalidTopic, fate: fatePermanent, why: "the topic name is not valid for this broker"},
	{err: sarama.ErrTopicAuthorizationFailed, fate: fatePermanent, why: "the relay may not write the topic: an ACL needs an operator"},
	{err: sarama.ConfigurationError(""), fate: fatePermanent, why: "the record is larger than Producer.MaxMessageBytes (checked before sending)"},
}

// classify returns err's rule; an error not in the table is transient and
// not retried within the send.
func classify(err error) kafkaRule {
	if err == nil {
		return kafkaRule{}
	}
	var cerr sarama.ConfigurationError
	for _, k := range kafkaRules {
		if _, ok := k.err.(sarama.ConfigurationError); ok {
			if errors.As(err, &cerr) {
				return k
			}
			continue
		}
		if errors.Is(err, k.err) {
			return k
		}
	}
	return kafkaRule{why: "not a Kafka error the relay knows: transient"}
}

// retriable reports whether a chunk's failure is worth sending the same
// batch again within the send: a request that failed as a whole
// (connection, timeout) is, and so are the errors the table says.
func retriable(r chunkResult) bool { return r.net || classify(r.err).retry }
