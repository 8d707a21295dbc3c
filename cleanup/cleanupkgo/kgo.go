// Package cleanupkgo implements cleanup.Admin, what package cleanup
// reads from Kafka, over franz-go's admin client, so a service on franz-go
// embeds cleanup without linking sarama:
//
//	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
//	...
//	c, err := cleanup.New(cleanup.Config{Pool: pool, Admin: cleanupkgo.New(kadm.NewClient(cl))})
package cleanupkgo

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/pgbox/pgbox/cleanup/internal/cleanupadmin"
)

// New returns a cleanup.Admin (for cleanup.Config.Admin) reading through
// adm. Closing adm's client stays the caller's business.
func New(adm *kadm.Client) cleanupadmin.Admin {
	return &kafka{adm: adm}
}

type kafka struct{ adm *kadm.Client }

// answered returns err when a kadm call failed as a whole: kadm hands back
// what the brokers that answered said, with *kadm.ShardErrors for the rest,
// and the topics of the rest are then missing from the result.
func answered(err error, got int) error {
	var shards *kadm.ShardErrors
	if err == nil || (errors.As(err, &shards) && !shards.AllFailed && got > 0) {
		return nil
	}
	return err
}

// TopicConfigs describes every topic in one DescribeConfigs request.
func (k *kafka) TopicConfigs(ctx context.Context, topics, names []string) (map[string]cleanupadmin.TopicConfig, error) {
	rcs, err := k.adm.DescribeTopicConfigs(ctx, topics...)
	if err := answered(err, len(rcs)); err != nil {
		return nil, fmt.Errorf("describe configs: %w", err)
	}
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]cleanupadmin.TopicConfig, len(rcs))
	for _, rc := range rcs {
		switch {
		case errors.Is(rc.Err, kerr.UnknownTopicOrPartition):
			out[rc.Name] = cleanupadmin.TopicConfig{NotFound: true}
			continue
		case rc.Err != nil:
			err := rc.Err
			if rc.ErrMessage != "" {
				err = fmt.Errorf("%w: %s", rc.Err, rc.ErrMessage)
			}
			out[rc.Name] = cleanupadmin.TopicConfig{Err: err}
			continue
		}
		vals := make(map[string]string, len(names))
		for _, c := range rc.Configs {
			if want[c.Key] && !c.Sensitive && c.Value != nil {
				vals[c.Key] = *c.Value
			}
		}
		out[rc.Name] = cleanupadmin.TopicConfig{Values: vals}
	}
	return out, nil
}

// LogStarts reads the topics' ids in one Metadata request, then every
// partition's log start offset in one ListOffsets request per leader.
func (k *kafka) LogStarts(ctx context.Context, topics []string) (map[string]cleanupadmin.LogStarts, error) {
	md, err := k.adm.Metadata(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	out := make(map[string]cleanupadmin.LogStarts, len(md.Topics))
	var known []string
	for name, td := range md.Topics {
		ls := cleanupadmin.LogStarts{}
		if td.ID != (kadm.TopicID{}) {
			ls.ID = base64.RawURLEncoding.EncodeToString(td.ID[:]) // as Kafka prints it
		}
		switch {
		case errors.Is(td.Err, kerr.UnknownTopicOrPartition):
			ls.NotFound = true
		case td.Err != nil:
			ls.Err = td.Err
		default:
			known = append(known, name)
		}
		out[name] = ls
	}
	if len(known) == 0 {
		return out, nil
	}
	listed, err := k.adm.ListStartOffsets(ctx, known...)
	if err := answered(err, len(listed)); err != nil {
		return nil, fmt.Errorf("list offsets: %w", err)
	}
	for _, name := range known {
		ls := out[name]
		ls.Offsets, ls.Failed = map[int32]int64{}, map[int32]error{}
		for _, p := range md.Topics[name].Partitions.Numbers() {
			o, ok := listed.Lookup(name, p)
			switch {
			case !ok:
				ls.Failed[p] = errors.New("partition missing from the ListOffsets answer")
			case o.Err != nil:
				ls.Failed[p] = o.Err
			case o.Offset < 0:
				ls.Failed[p] = fmt.Errorf("no log start offset (got %d)", o.Offset)
			default:
				ls.Offsets[p] = o.Offset
			}
		}
		out[name] = ls
	}
	return out, nil
}
