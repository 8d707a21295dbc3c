package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/IBM/sarama"
)

func (h *Harness) producer() (sarama.SyncProducer, error) {
	c := *h.kcfg
	c.Producer.Return.Successes = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Backoff = 50 * time.Millisecond
	p, err := sarama.NewSyncProducer(h.Brokers, &c)
	if err != nil {
		return nil, fmt.Errorf("order producer: %w", err)
	}
	return p, nil
}

// Produce sends the unique orders at --rate, each followed at once by a
// resend with the same order id for --duplicate-percent of them (a producer
// retrying after a timeout it could not tell from a failure).
func (h *Harness) Produce(ctx context.Context) error {
	p, err := h.producer()
	if err != nil {
		return err
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(42, uint64(time.Now().UnixNano())))
	const tick = 20 * time.Millisecond
	perTick := 200
	if h.cfg.Rate > 0 {
		perTick = max(1, h.cfg.Rate*int(tick)/int(time.Second))
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; i < h.cfg.Orders; {
		var batch []*sarama.ProducerMessage
		var resends int64
		for n := 0; n < perTick && i < h.cfg.Orders; n, i = n+1, i+1 {
			o := Order{OrderID: fmt.Sprintf("ord-%06d", i), Customer: fmt.Sprintf("cust-%03d", rng.IntN(500)),
				AmountCents: 100 + rng.Int64N(99_900), SentAtNanos: time.Now().UnixNano()}
			v, _ := json.Marshal(o)
			m := &sarama.ProducerMessage{Topic: h.Orders, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(v),
				Headers: []sarama.RecordHeader{{Key: []byte(OrderIDHeader), Value: []byte(o.OrderID)}}}
			batch = append(batch, m)
			if rng.IntN(100) < h.cfg.DupPercent {
				dup := *m
				batch = append(batch, &dup)
				resends++
			}
		}
		if err := p.SendMessages(batch); err != nil {
			return fmt.Errorf("send orders: %w", err)
		}
		h.counters.sent.Add(int64(len(batch)) - resends)
		h.counters.resent.Add(resends)
		if h.cfg.Rate > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// Replay re-sends --replay records read back from an earlier offset of each
// partition (a mirror or a recovery script re-publishing a range): same key,
// value and headers, new offsets.
func (h *Harness) Replay(ctx context.Context) error {
	if h.cfg.Replay == 0 {
		return nil
	}
	client, err := sarama.NewClient(h.Brokers, h.ConsumerConfig())
	if err != nil {
		return fmt.Errorf("replay client: %w", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("replay consumer: %w", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(h.Orders)
	if err != nil {
		return fmt.Errorf("replay: partitions of %s: %w", h.Orders, err)
	}
	var records []*sarama.ProducerMessage
	left := h.cfg.Replay
	for i, part := range parts {
		share := left / (len(parts) - i)
		hwm, err := client.GetOffset(h.Orders, part, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("replay: offsets of %s/%d: %w", h.Orders, part, err)
		}
		share = int(min(int64(share), hwm))
		if share == 0 {
			continue
		}
		from := hwm / 3 // an earlier offset, well inside what was already consumed
		if from+int64(share) > hwm {
			from = hwm - int64(share)
		}
		pc, err := consumer.ConsumePartition(h.Orders, part, from)
		if err != nil {
			return fmt.Errorf("replay: consume %s/%d from %d: %w", h.Orders, part, from, err)
		}
		for n := 0; n < share; n++ {
			select {
			case m := <-pc.Messages():
				hs := make([]sarama.RecordHeader, len(m.Headers))
				for j, h := range m.Headers {
					hs[j] = *h
				}
				records = append(records, &sarama.ProducerMessage{Topic: h.Orders, Key: sarama.ByteEncoder(m.Key),
					Value: sarama.ByteEncoder(m.Value), Headers: hs})
			case <-ctx.Done():
				pc.Close()
				return ctx.Err()
			}
		}
		pc.Close()
		left -= share
	}
	p, err := h.producer()
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.SendMessages(records); err != nil {
		return fmt.Errorf("replay orders: %w", err)
	}
	h.counters.replayed.Add(int64(len(records)))
	return nil
}
