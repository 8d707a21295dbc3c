package main

import (
	"context"
	"fmt"
	"io/fs"
	"runtime"
	"slices"
	"strings"

	"github.com/pgbox/pgbox"
	"github.com/pgbox/pgbox/migrations"
)

// schemaVersion is the newest migration the binary ships.
func schemaVersion() string {
	names, _ := fs.Glob(migrations.FS(), "*.sql")
	if len(names) == 0 {
		return "none"
	}
	v, _, _ := strings.Cut(slices.Max(names), "_")
	return strings.TrimLeft(v, "0")
}

func cmdVersion(_ context.Context, a *app, args []string) error {
	if len(args) > 0 {
		return usageError("version takes no arguments (got %q)", args)
	}
	fmt.Fprintf(a.stdout, "relay %s\nschema %s (migrations in table %s)\n%s %s/%s\n",
		pgbox.Version, schemaVersion(), migrations.TableName, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
