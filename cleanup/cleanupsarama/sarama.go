// Package cleanupsarama implements cleanup.Admin, what package cleanup
// reads from Kafka, over a sarama ClusterAdmin:
//
//	admin, err := sarama.NewClusterAdmin(brokers, cfg)
//	...
//	c, err := cleanup.New(cleanup.Config{Pool: pool, Admin: cleanupsarama.New(admin)})
//
// A service on franz-go uses package cleanupkgo instead and never links
// sarama.
package cleanupsarama

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/cleanup/internal/cleanupadmin"
)

// ClusterAdmin is the part of sarama.ClusterAdmin the cleaner uses; a
// sarama.ClusterAdmin satisfies it. Topic ids need cfg.Version 2.8 or later.
type ClusterAdmin interface {
	DescribeConfigs(resources []*sarama.ConfigResource, options sarama.DescribeConfigsOptions) ([]*sarama.ConfigResourceResult, error)
	DescribeTopics(topics []string) ([]*sarama.TopicMetadata, error)
	ListOffsets(partitions map[string]map[int32]int64, options *sarama.ListOffsetsOptions) (map[string]map[int32]*sarama.OffsetResult, error)
}

// New returns a cleanup.Admin (for cleanup.Config.Admin) reading through
// admin. Closing admin stays the caller's business.
func New(admin ClusterAdmin) cleanupadmin.Admin {
	return &kafka{admin: admin}
}

type kafka struct{ admin ClusterAdmin }

// aside runs a sarama call, which takes no context, on a goroutine of its
// own, so that a cancelled ctx or a hung broker does not hold the caller.
// The goroutine ends when sarama's own network timeouts fire.
func aside[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type answer struct {
		v   T
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		v, err := f()
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		return a.v, a.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// TopicConfigs describes every topic in one DescribeConfigs request (sarama
// sends all topic resources to one broker).
func (k *kafka) TopicConfigs(ctx context.Context, topics, names []string) (map[string]cleanupadmin.TopicConfig, error) {
	res := make([]*sarama.ConfigResource, len(topics))
	for i, t := range topics {
		res[i] = &sarama.ConfigResource{Type: sarama.TopicResource, Name: t, ConfigNames: names}
	}
	results, err := aside(ctx, func() ([]*sarama.ConfigResourceResult, error) {
		return k.admin.DescribeConfigs(res, sarama.DescribeConfigsOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("describe configs: %w", err)
	}
	out := make(map[string]cleanupadmin.TopicConfig, len(results))
	for _, r := range results {
		if r == nil || r.Type != sarama.TopicResource {
			continue
		}
		out[r.Name] = topicConfig(r)
	}
	return out, nil
}

func topicConfig(r *sarama.ConfigResourceResult) cleanupadmin.TopicConfig {
	if r.ErrorCode != sarama.ErrNoError {
		if r.ErrorCode == sarama.ErrUnknownTopicOrPartition {
			return cleanupadmin.TopicConfig{NotFound: true}
		}
		err := error(r.ErrorCode)
		if r.ErrorMsg != "" {
			err = fmt.Errorf("%w: %s", r.ErrorCode, r.ErrorMsg)
		}
		return cleanupadmin.TopicConfig{Err: err}
	}
	vals := make(map[string]string, len(r.Configs))
	for _, e := range r.Configs {
		if !e.Sensitive {
			vals[e.Name] = e.Value
		}
	}
	return cleanupadmin.TopicConfig{Values: vals}
}

// LogStarts reads the topics' partitions and ids in one Metadata request,
// then every partition's log start offset in one ListOffsets request per
// leader.
func (k *kafka) LogStarts(ctx context.Context, topics []string) (map[string]cleanupadmin.LogStarts, error) {
	meta, err := aside(ctx, func() ([]*sarama.TopicMetadata, error) { return k.admin.DescribeTopics(topics) })
	if err != nil {
		return nil, fmt.Errorf("describe topics: %w", err)
	}
	out := make(map[string]cleanupadmin.LogStarts, len(meta))
	query := map[string]map[int32]int64{}
	for _, m := range meta {
		if m == nil {
			continue
		}
		ls := cleanupadmin.LogStarts{}
		if m.Uuid != (sarama.Uuid{}) {
			ls.ID = m.Uuid.String()
		}
		switch {
		case errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition):
			ls.NotFound = true
		case m.Err != sarama.ErrNoError:
			ls.Err = m.Err
		case len(m.Partitions) > 0:
			query[m.Name] = make(map[int32]int64, len(m.Partitions))
			for _, p := range m.Partitions {
				query[m.Name][p.ID] = sarama.OffsetOldest
			}
		}
		out[m.Name] = ls
	}
	if len(query) == 0 {
		return out, nil
	}
	offsets, err := aside(ctx, func() (map[string]map[int32]*sarama.OffsetResult, error) {
		return k.admin.ListOffsets(query, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	for topic, parts := range query {
		ls := out[topic]
		ls.Offsets, ls.Failed = map[int32]int64{}, map[int32]error{}
		for p := range parts {
			r := offsets[topic][p]
			switch {
			case r == nil:
				ls.Failed[p] = errors.New("partition missing from the ListOffsets answer")
			case r.Err != nil && !errors.Is(r.Err, sarama.ErrNoError):
				ls.Failed[p] = r.Err
			case r.Offset < 0:
				ls.Failed[p] = fmt.Errorf("no log start offset (got %d)", r.Offset)
			default:
				ls.Offsets[p] = r.Offset
			}
		}
		out[topic] = ls
	}
	return out, nil
}
