package archtest

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Kafka client a package may link. franz is franz-go's client and its
// protocol packages (kgo, kadm, kmsg, kerr…); kfake, the embedded broker, is
// named on its own although it ships from the same repository.
const (
	clientSarama = "sarama"
	clientFranz  = "franz-go"
	clientKfake  = "kfake"
)

// kafkaClientOf says which client a dependency belongs to, "" for none.
func kafkaClientOf(dep string) string {
	switch {
	case dep == sarama || strings.HasPrefix(dep, sarama+"/"):
		return clientSarama
	case dep == kfake || strings.HasPrefix(dep, kfake+"/"):
		return clientKfake
	case strings.HasPrefix(dep, "github.com/twmb/franz-go/"):
		return clientFranz
	}
	return ""
}

// kafkaClients is the rule, for every package of the module: the Kafka
// clients its non-test code may link, directly or through any dependency.
// A key ending in "/..." covers a directory and everything under it; a
// package no key covers fails the test, so a new package gets a decision.
//
// The core (inbox, outbox, relay's readers, cleanup, inspect, the console,
// the observability packages) links none, so a service on either client
// links only the one it chose. Each adapter links its own client. Only
// examples, the end-to-end harness and the test helpers link the embedded
// broker; the production binary never does.
var kafkaClients = map[string][]string{
	"":                              nil, // the root package: pgbox.Version
	"cleanup":                       nil,
	"cleanup/internal/cleanupadmin": nil,
	"cleanup/cleanupkgo":            {clientFranz},
	"cleanup/cleanupsarama":         {clientSarama},
	"cmd/relay":                     {clientSarama},
	"console":                       nil,
	"deploy":                        nil,
	"examples/...":                  {clientSarama, clientFranz, clientKfake},
	"inbox":                         nil,
	"inbox/internal/consume":        nil,
	"inbox/internal/owntx":          nil,
	"inbox/internal/consumetest":    {clientSarama, clientFranz, clientKfake}, // _test files only (TestConsumetestOnlyInTests)
	"inbox/inboxfranz":              {clientFranz},
	"inbox/inboxsarama":             {clientSarama},
	"inspect":                       nil,
	"integration_test/...":          {clientSarama, clientFranz, clientKfake},
	"internal/kafkaconf":            {clientSarama},
	"internal/kafkatest":            {clientSarama, clientFranz, clientKfake},
	"internal/...":                  nil,
	"migrations":                    nil,
	"outbox":                        nil,
	"pgboxotel":                     nil, // the relay's hook types are outbox's
	"pgboxprom":                     nil, // reads the relay through pgboxprom.Relay
	"relay":                         {clientSarama},
}

// kafkaRule finds the entry covering path: an exact key first, then the
// longest "/..." key.
func kafkaRule(path string) (allowed []string, ok bool) {
	if a, ok := kafkaClients[path]; ok {
		return a, true
	}
	best := ""
	for k := range kafkaClients {
		dir, isTree := strings.CutSuffix(k, "/...")
		if isTree && (path == dir || strings.HasPrefix(path, dir+"/")) && len(k) > len(best) {
			best = k
		}
	}
	if best == "" {
		return nil, false
	}
	return kafkaClients[best], true
}

// TestKafkaClients: every package links only the Kafka clients the table
// allows it (go list's transitive, non-test dependencies).
func TestKafkaClients(t *testing.T) {
	t.Parallel()
	sawSarama := false
	for _, p := range listAll(t) {
		path := rel(p.ImportPath)
		allowed, ok := kafkaRule(path)
		require.True(t, ok, "%s is not in internal/archtest's kafkaClients table: add it with the Kafka clients it may link", path)
		for _, d := range p.Deps {
			c := kafkaClientOf(d)
			sawSarama = sawSarama || c == clientSarama
			require.True(t, c == "" || slices.Contains(allowed, c), "%s links %s (%s), which kafkaClients does not allow it", path, d, c)
		}
	}
	require.True(t, sawSarama, "no package links sarama: the listing is not the real one")
}

// The table itself: what each pattern means.
func TestKafkaRuleLookup(t *testing.T) {
	t.Parallel()
	for path, want := range map[string][]string{
		"relay":                             {clientSarama},
		"internal/slot":                     nil,
		"internal/kafkatest":                {clientSarama, clientFranz, clientKfake},
		"examples/demo/internal/harness":    {clientSarama, clientFranz, clientKfake},
		"integration_test/cmd/chaosproc":    {clientSarama, clientFranz, clientKfake},
		"cleanup/internal/cleanupadmin":     nil,
		"inbox/internal/consumetest":        {clientSarama, clientFranz, clientKfake},
		"integration_test":                  {clientSarama, clientFranz, clientKfake},
		"github.com/pgbox/pgbox/not-a-path": nil,
	} {
		got, ok := kafkaRule(path)
		if strings.HasPrefix(path, "github.com/") {
			require.False(t, ok, path)
			continue
		}
		require.True(t, ok, path)
		require.Equal(t, want, got, path)
	}
	for dep, want := range map[string]string{
		"github.com/IBM/sarama":              clientSarama,
		"github.com/IBM/sarama/mocks":        clientSarama,
		"github.com/twmb/franz-go/pkg/kgo":   clientFranz,
		"github.com/twmb/franz-go/pkg/kadm":  clientFranz,
		"github.com/twmb/franz-go/pkg/kfake": clientKfake,
		"github.com/twmb/franz-go/pkg/kmsg":  clientFranz,
		"github.com/IBM/saramax":             "",
		"github.com/jackc/pgx/v5":            "",
	} {
		require.Equal(t, want, kafkaClientOf(dep), dep)
	}
}
