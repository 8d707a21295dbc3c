package archtest

import (
	"go/ast"
	"go/token"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOneSettingsWord: a library package's settings struct is a Config (or a
// …Config), never an Options: one word for every constructor. The binary,
// examples and internal packages are not public API and are not checked.
func TestOneSettingsWord(t *testing.T) {
	t.Parallel()
	var found []string
	skip := func(rel string) bool {
		top, _, _ := strings.Cut(rel, "/")
		return strings.HasSuffix(rel, "/internal") || rel == "internal" || top == "cmd" || top == "examples" ||
			top == "integration_test" || top == "scripts" || top == "deploy"
	}
	eachSourceFile(t, skip, func(fset *token.FileSet, f *ast.File) {
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				name := spec.(*ast.TypeSpec).Name.Name
				if ast.IsExported(name) && strings.HasSuffix(name, "Options") {
					found = append(found, fset.Position(spec.Pos()).String()+": "+name)
				}
			}
		}
	})
	require.Empty(t, found, "settings structs are named Config (or …Config), as CONTRIBUTING says")
}
