package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
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
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			if filepath.ToSlash(path) == filepath.ToSlash(filepath.Join(root, "internal", "pgerr")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
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
		return nil
	})
	require.NoError(t, err)
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
