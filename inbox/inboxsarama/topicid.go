package inboxsarama

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// fetchTopicID asks the cluster for topic's id (MetadataRequest v10+, Kafka
// ≥ 2.8), formatted as Kafka's tools print it (URL-safe base64). It returns
// "" without error when ids are unavailable: a client configured for an older
// protocol version, or a broker that reports the all-zero id.
func fetchTopicID(client sarama.Client, topic string) (string, error) {
	cfg := client.Config()
	if !cfg.Version.IsAtLeast(sarama.V2_8_0_0) {
		return "", nil
	}
	broker := client.LeastLoadedBroker()
	if broker == nil {
		return "", fmt.Errorf("read id of topic %s: no broker available", topic)
	}
	if err := broker.Open(cfg); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
		return "", fmt.Errorf("read id of topic %s: connect to broker %s: %w", topic, broker.Addr(), err)
	}
	resp, err := broker.GetMetadata(sarama.NewMetadataRequest(cfg.Version, []string{topic}))
	if err != nil {
		return "", fmt.Errorf("read id of topic %s: metadata request to %s: %w", topic, broker.Addr(), err)
	}
	for _, t := range resp.Topics {
		if t.Name != topic {
			continue
		}
		if !errors.Is(t.Err, sarama.ErrNoError) {
			return "", fmt.Errorf("read id of topic %s: %w", topic, t.Err)
		}
		if t.Uuid == (sarama.Uuid{}) {
			return "", nil
		}
		return t.Uuid.String(), nil
	}
	return "", fmt.Errorf("read id of topic %s: not in the metadata response", topic)
}
