// Package promtest reads a Prometheus collector's samples in tests.
package promtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Samples registers c in a fresh registry and returns every sample as
// name{labels} -> value (labels in the registry's order: by name).
func Samples(t testing.TB, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// Require asserts that samples (from Samples) hold each of want's
// samples with its value.
func Require(t testing.TB, samples, want map[string]float64) {
	t.Helper()
	for name, v := range want {
		require.Contains(t, samples, name)
		require.Equal(t, v, samples[name], name)
	}
}
