package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// The table is consistent, and every error gets the class the relay's
// behaviour depends on, wrapped as the relay wraps it.
func TestKafkaErrorTable(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, k := range kafkaRules {
		name := fmt.Sprint(k.err)
		require.False(t, seen[name], "%s is in the table twice", name)
		seen[name] = true
		require.NotEmpty(t, k.why, "%s: say why", name)
		if k.split {
			require.Equal(t, fatePermanent, k.fate, "%s: a rejected record is the row's fault", name)
			require.False(t, k.retry, "%s: the same batch would be rejected again", name)
		}
		if k.newID {
			require.True(t, k.retry, "%s: a new producer id is taken to send again", name)
		}
		wrapped := fmt.Errorf("topic t partition 0: %w", k.err)
		require.Equal(t, k, classify(wrapped), "%s wrapped", name)
	}

	// What each class does, by example.
	for _, tc := range []struct {
		err                 error
		retry, newID, split bool
		fate                fate
	}{
		{sarama.ErrNotLeaderForPartition, true, false, false, fateTransient},
		{sarama.ErrRequestTimedOut, true, false, false, fateTransient},
		{sarama.ErrOutOfOrderSequenceNumber, true, true, false, fateTransient},
		// The two-stage rule: retried within the send, then for the window.
		{sarama.ErrUnknownTopicOrPartition, true, false, false, fateMissingTopic},
		{sarama.ErrMessageSizeTooLarge, false, false, true, fatePermanent},
		{sarama.ErrTopicAuthorizationFailed, false, false, false, fatePermanent},
		{sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 5 > 4"), false, false, false, fatePermanent},
		// Not Kafka's verdict on the row: never parks it.
		{sarama.ErrOutOfBrokers, false, false, false, fateTransient},
		{io.EOF, false, false, false, fateTransient},
		{context.Canceled, false, false, false, fateTransient},
		{errors.New("something new"), false, false, false, fateTransient},
	} {
		k := classify(fmt.Errorf("init producer id: %w", tc.err))
		require.Equal(t, []any{tc.retry, tc.newID, tc.split, tc.fate}, []any{k.retry, k.newID, k.split, k.fate}, "%v", tc.err)
	}
	require.True(t, retriable(chunkResult{err: io.EOF, net: true}), "a request that failed as a whole is sent again")
	require.False(t, retriable(chunkResult{err: sarama.ErrInvalidRecord}))
}
