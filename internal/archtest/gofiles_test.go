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

// eachSourceFile parses every non-test Go file of the module below its root
// and calls visit with it, skipping hidden and testdata directories and every
// directory skipDir (given its slash-separated path from the root) names.
func eachSourceFile(t *testing.T, skipDir func(rel string) bool, visit func(fset *token.FileSet, f *ast.File)) {
	t.Helper()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel := filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator)))
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || skipDir(rel)) {
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
		visit(fset, f)
		return nil
	})
	require.NoError(t, err)
}
