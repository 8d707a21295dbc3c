package console_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"golang.org/x/crypto/bcrypt"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/internal/testdb"
)

// A service mounts the console on its own mux, under /console/, for one
// operator who logs in with basic auth. The hash comes from the
// environment (in production: htpasswd -nbB ops <password>).
func Example() {
	ctx := context.Background()
	db, done := testdb.Example(ctx) // the service's migrated database (a *pgxpool.Pool)
	defer done()
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	os.Setenv("CONSOLE_OPS_HASH", string(hash))

	// The ten lines.
	ui, err := console.New(console.Config{
		DB:     db.Pool,
		Prefix: "/console",
		Auth: console.Auth{Users: []console.User{
			{Name: "ops", PasswordHash: os.Getenv("CONSOLE_OPS_HASH"), Role: console.RoleOperator},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", ui)

	srv := httptest.NewServer(mux) // the service's own server
	defer srv.Close()
	for _, login := range []string{"", "s3cret"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/console/", nil)
		if login != "" {
			req.SetBasicAuth("ops", login)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status, resp.Header.Get("Content-Type"))
	}
	// Output:
	// 401 Unauthorized text/plain; charset=utf-8
	// 200 OK text/html; charset=utf-8
}
