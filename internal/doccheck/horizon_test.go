package doccheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/pgbox/pgbox/inspect"
)

// TestHorizonAlertBounds: the xmin-horizon alerts of docs/alerts.yml fire
// at the bounds `relay status` and the console warn at
// (inspect.HorizonWarnAge, inspect.HorizonWarnTransactions), and
// docs/operations.md quotes the same figures.
func TestHorizonAlertBounds(t *testing.T) {
	t.Parallel()
	var rules alertRules
	require.NoError(t, yaml.Unmarshal([]byte(read(t, "docs/alerts.yml")), &rules))
	exprs := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	require.Equal(t, fmt.Sprintf("max by (kind) (pgbox_xmin_horizon_age_seconds) > %d", int(inspect.HorizonWarnAge.Seconds())), exprs["PgboxXminHorizonHeld"])
	require.Equal(t, fmt.Sprintf(`max by (kind) (pgbox_xmin_horizon_age_transactions{kind!="%s"}) > %d`, inspect.HolderSlotCatalog, inspect.HorizonWarnTransactions),
		exprs["PgboxXminHorizonHeldTransactions"])

	ops := strings.ReplaceAll(read(t, "docs/operations.md"), ",", "")
	for _, want := range []string{
		fmt.Sprintf("`inspect.HorizonWarnAge` (%d minutes)", int(inspect.HorizonWarnAge.Minutes())),
		fmt.Sprintf("`inspect.HorizonWarnTransactions` (%d transactions", inspect.HorizonWarnTransactions),
	} {
		require.True(t, strings.Contains(ops, want), "docs/operations.md does not quote %s (thousands separators ignored)", want)
	}
}
