package pgboxprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgbox/pgbox/inbox"
)

// Consumer is what the collector reads of a consumer adapter, whichever
// Kafka client it drives: *inboxsarama.Handler and *inboxfranz.Consumer are
// both one, so the collector links neither client.
type Consumer interface {
	Stats() inbox.ConsumerStats
}

// collectConsumer exports the consumer adapter's counters.
func (c *Collector) collectConsumer(ch chan<- prometheus.Metric) {
	s := c.cfg.Consumer.Stats()
	counter(ch, dConsProcessed, float64(s.Processed))
	counter(ch, dConsDup, float64(s.Duplicates))
	counter(ch, dConsFailures, float64(s.Failures))
	counter(ch, dConsTransient, float64(s.TransientErrors))
	counter(ch, dConsOperator, float64(s.OperatorErrors))
	counter(ch, dConsDead, float64(s.DeadLettered))
	counter(ch, dConsRetries, float64(s.Retries))
}
