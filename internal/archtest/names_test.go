package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOneSettingsWord: a library package's settings struct is a Config (or a
// …Config), never an Options: one word for every constructor. The binary,
// examples and internal packages are not public API and are not checked.
func TestOneSettingsWord(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
		if d.IsDir() {
			top, _, _ := strings.Cut(rel, "/")
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "internal" ||
				top == "cmd" || top == "examples" || top == "integration_test" || top == "scripts" || top == "deploy") {
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
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "settings structs are named Config (or …Config), as CONTRIBUTING says")
}
