package kafkaconf

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// The README says brokers from 0.11 are supported: every way Kafka users
// write a version is accepted, and versions before 0.11 are refused.
func TestParseVersionForms(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]sarama.KafkaVersion{
		"0.11":     sarama.V0_11_0_0,
		"0.11.0":   sarama.V0_11_0_0,
		"0.11.0.2": sarama.V0_11_0_2,
		"1.0":      sarama.V1_0_0_0,
		"2.8":      sarama.V2_8_0_0,
		"2.8.0":    sarama.V2_8_0_0,
		"v3.6.0":   sarama.V3_6_0_0,
		"3.6-IV2":  sarama.V3_6_0_0,
		" 3.6.1 ":  sarama.V3_6_1_0,
	} {
		got, err := ParseVersion(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"banana", "", "3", "0.10.2", "0.10.2.0", "2.8.0.1.2"} {
		_, err := ParseVersion(in)
		require.Error(t, err, in)
	}
}
