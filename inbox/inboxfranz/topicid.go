package inboxfranz

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchTopicID asks the cluster for topic's id (MetadataRequest v10+, Kafka
// ≥ 2.8), formatted as Kafka's tools (and inboxsarama) print it: URL-safe
// base64 without padding. It returns "" without error when the broker
// reports the all-zero id.
func fetchTopicID(ctx context.Context, cl *kgo.Client, topic string) (string, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("read id of topic %s: metadata request: %w", topic, err)
	}
	for _, rt := range resp.Topics {
		if rt.Topic == nil || *rt.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			return "", fmt.Errorf("read id of topic %s: %w", topic, err)
		}
		if rt.TopicID == ([16]byte{}) {
			return "", nil
		}
		return base64.URLEncoding.WithPadding(base64.NoPadding).EncodeToString(rt.TopicID[:]), nil
	}
	return "", fmt.Errorf("read id of topic %s: not in the metadata response", topic)
}
