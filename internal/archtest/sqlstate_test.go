package archtest

import (
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sqlstate is a five-character SQLSTATE: digits and capitals, at least one
// digit (which tells "42P01" and "XX000" from words like "TOPIC").
var sqlstate = regexp.MustCompile(`^[0-9A-Z]{5}$`)

func isSQLSTATE(s string) bool {
	return sqlstate.MatchString(s) && strings.ContainsAny(s, "0123456789")
}

// TestSQLSTATEsOnlyInPgerr: internal/pgerr alone names SQLSTATE codes (its
// Code… constants, its classifier); everything else asks it. A literal like
// "42P01" or "23505" in any other non-test Go file fails.
func TestSQLSTATEsOnlyInPgerr(t *testing.T) {
	t.Parallel()
	var found []string
	skip := func(rel string) bool {
		return rel == "internal/pgerr" || strings.HasSuffix(rel, "/node_modules") || rel == "node_modules"
	}
	eachSourceFile(t, skip, func(fset *token.FileSet, f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && isSQLSTATE(s) {
				found = append(found, fset.Position(lit.Pos()).String()+": "+lit.Value)
			}
			return true
		})
	})
	require.Empty(t, found, "SQLSTATE literals outside internal/pgerr: use its Code… constants and Is/Classify (add a constant there if one is missing)")
}

func TestIsSQLSTATE(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"42P01", "23505", "XX000", "57014", "P0001"} {
		require.True(t, isSQLSTATE(s), s)
	}
	for _, s := range []string{"TOPIC", "ERROR", "GOMOD", "PLAIN", "4201", "42p01", "423456"} {
		require.False(t, isSQLSTATE(s), s)
	}
}
