package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgbox/pgbox/relay"
)

// Verify reads the payments topic from the start: one payment per order is
// the check; the time from order sent to payment read is the latency.
func (h *Harness) Verify(ctx context.Context) error {
	client, err := sarama.NewClient(h.Brokers, h.ConsumerConfig())
	if err != nil {
		return fmt.Errorf("payments reader: %w", err)
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("payments reader: %w", err)
	}
	defer consumer.Close()
	parts, err := client.Partitions(h.Payments)
	if err != nil {
		return fmt.Errorf("payments reader: partitions of %s: %w", h.Payments, err)
	}
	var wg sync.WaitGroup
	for _, part := range parts {
		pc, err := consumer.ConsumePartition(h.Payments, part, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("payments reader: %s/%d: %w", h.Payments, part, err)
		}
		wg.Go(func() {
			defer pc.Close()
			for {
				select {
				case m := <-pc.Messages():
					h.readPayment(m)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (h *Harness) readPayment(m *sarama.ConsumerMessage) {
	now := time.Now()
	var p Payment
	if err := json.Unmarshal(m.Value, &p); err != nil {
		h.log.Error("payment is not JSON", "partition", m.Partition, "offset", m.Offset, "error", err)
		return
	}
	eventID := ""
	for _, h := range m.Headers {
		if string(h.Key) == relay.EventIDHeader {
			eventID = string(h.Value)
		}
	}
	h.counters.paymentsRead.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	// The relay may publish one event twice (a crash between Kafka's ack and
	// the delete): same event id, and consumers drop it. Two event ids for
	// one order are two payments: the failure this demo checks for.
	ids := h.seen[p.OrderID]
	if ids == nil {
		ids = map[string]struct{}{}
		h.seen[p.OrderID] = ids
	}
	ids[eventID] = struct{}{}
	if len(ids) == 1 && h.latSeen(p.OrderID) {
		h.counters.paymentsUnique.Add(1)
		h.latencies = append(h.latencies, now.Sub(time.Unix(0, p.OrderSentAt)))
	}
}

// latSeen reports whether this is the order's first payment (its latency is
// measured once). h.mu is held.
func (h *Harness) latSeen(orderID string) bool {
	if h.latDone[orderID] {
		return false
	}
	h.latDone[orderID] = true
	return true
}
