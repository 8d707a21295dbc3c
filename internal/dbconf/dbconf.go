// Package dbconf opens the pgx pool that pgbox's binary and examples connect
// with, and keeps a DSN's password out of every message they print.
package dbconf

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PingTimeout bounds the check that a new pool's database answers.
const PingTimeout = 15 * time.Second

// Config parses dsn (a URL or key=value DSN). A non-empty schema becomes the
// connections' search_path, maxConns > 0 the pool's size, and appName the
// application_name unless the DSN sets one. Its error never contains the
// DSN's password.
func Config(dsn, schema string, maxConns int, appName string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%s", RedactErr(err, dsn)) // pgx's parse errors can echo the DSN
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	return cfg, nil
}

// Open connects with cfg and checks that the database answers. Errors name
// the database by dsn, its password masked.
func Open(ctx context.Context, cfg *pgxpool.Config, dsn string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database %s: %s", RedactDSN(dsn), RedactErr(err, dsn))
	}
	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s unreachable: %s", RedactDSN(dsn), RedactErr(err, dsn))
	}
	return pool, nil
}

// RedactErr returns err's text with dsn, and dsn's password, masked
// wherever they appear.
func RedactErr(err error, dsn string) string {
	msg := err.Error()
	if dsn == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, dsn, RedactDSN(dsn))
	if u, perr := url.Parse(dsn); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactDSN masks the password of a PostgreSQL URL or key=value DSN (the
// password=... query parameter too). Text it cannot parse is returned with
// anything after "://" up to "@" masked, to be safe.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	if !strings.Contains(dsn, "://") {
		return kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		if i, j := strings.Index(dsn, "://"), strings.LastIndex(dsn, "@"); j > i {
			return dsn[:i+3] + "xxxxx" + dsn[j:]
		}
		return "(unparseable, redacted)"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
