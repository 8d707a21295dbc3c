package deploy

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite deploy/kubernetes/prometheusrule.yaml from docs/alerts.yml")

const promRuleHeader = `# Code generated from docs/alerts.yml by ` + "`go test ./deploy -run TestPrometheusRuleMatchesAlerts -update`" + `. DO NOT EDIT.
# The alert rules as a Prometheus Operator PrometheusRule; docs/alerts.yml
# explains them.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: pgbox
  labels:
    app.kubernetes.io/name: pgbox
spec:
`

// promRule generates prometheusrule.yaml from a Prometheus rule file: its
// groups block, indented under spec, byte for byte (expressions, comments and
// all), after the PrometheusRule's header.
func promRule(alerts string) (string, error) {
	i := strings.Index(alerts, "\ngroups:\n")
	if i < 0 {
		return "", errors.New("docs/alerts.yml has no top-level groups: key")
	}
	var b strings.Builder
	b.WriteString(promRuleHeader)
	for _, line := range strings.SplitAfter(alerts[i+1:], "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return b.String(), nil
}

// TestPrometheusRuleMatchesAlerts: deploy/kubernetes/prometheusrule.yaml is
// what the generator makes of docs/alerts.yml (run with -update to rewrite
// it), and its groups decode to exactly alerts.yml's.
func TestPrometheusRuleMatchesAlerts(t *testing.T) {
	t.Parallel()
	alerts, err := os.ReadFile(filepath.Join(root, "docs", "alerts.yml"))
	require.NoError(t, err)
	want, err := promRule(string(alerts))
	require.NoError(t, err)
	path := filepath.Join(kubeDir, "prometheusrule.yaml")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, string(got), "deploy/kubernetes/prometheusrule.yaml is stale: go test ./deploy -run TestPrometheusRuleMatchesAlerts -update")

	var src struct {
		Groups []any `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(alerts, &src))
	require.NotEmpty(t, src.Groups)
	rule := strictDecode(t, "prometheusrule.yaml", got, &prometheusRule{})
	require.Equal(t, "monitoring.coreos.com/v1", rule.APIVersion)
	require.Equal(t, "PrometheusRule", rule.Kind)
	require.Equal(t, src.Groups, rule.Spec.Groups)
}
