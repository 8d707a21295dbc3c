package gormexample_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/pgbox/pgbox/migrations"
)

// TestMain needs a PostgreSQL database: DATABASE_URL names it.
func TestMain(m *testing.M) {
	if os.Getenv("DATABASE_URL") == "" {
		fmt.Fprintln(os.Stderr, "examples/gorm: set DATABASE_URL to a PostgreSQL database where this user may create a schema,\n"+
			"for example DATABASE_URL='postgres://postgres@localhost:5432/postgres?sslmode=disable' go test ./...\n"+
			"(the example makes a schema of its own, migrates it with pgbox's migrations and drops it at the end)")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// database makes a schema of its own on DATABASE_URL, applies pgbox's
// migrations to it, and returns a URL whose connections use it (search_path)
// and a func that drops it. A service does the same once, with its own
// schema: `relay migrate up`, or migrations.Up at start-up.
func database(ctx context.Context) (schemaURL string, drop func(), err error) {
	base := os.Getenv("DATABASE_URL")
	admin, err := sql.Open("pgx", base)
	if err != nil {
		return "", nil, err
	}
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	schema := "gorm_example_" + hex.EncodeToString(suffix)
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create schema %s on DATABASE_URL: %w", schema, err)
	}
	drop = func() {
		_, _ = admin.ExecContext(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		return "", nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		drop()
		return "", nil, err
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		drop()
		return "", nil, err
	}
	return u.String(), drop, nil
}

// The example is a module a user can copy: it imports none of pgbox's
// internal packages (a module of the user's own cannot).
func TestImportsOnlyPublicPackages(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("list the example's files: %v", err)
	}
	for _, f := range files {
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s imports %s: a copy of this module outside pgbox cannot", f, p)
			}
		}
	}
}
