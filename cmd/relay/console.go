package main

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbox/pgbox/cleanup"
	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/relay"
)

// groupConsole holds the operator console's settings (run only).
const groupConsole = "Console"

// consoleTokenName names the --console-token's holder in the audit trail
// and in --console-operators.
const consoleTokenName = "token"

// consoleOptions are the console's settings.
type consoleOptions struct {
	Addr         string
	Users        []string
	Token        string
	Operators    []string
	ProxyHeader  string
	ProxyOps     []string
	HidePayloads bool
}

func (o *consoleOptions) bind(s *settings, has map[string]bool) {
	if !has[groupConsole] {
		return
	}
	s.str(&o.Addr, groupConsole, "console-addr", "PGBOX_CONSOLE_ADDR", "",
		"listen address of the operator console (empty: no console; with --targets or --targets-query, every target's); loopback only unless a user, token or proxy header is set")
	s.csv(&o.Users, groupConsole, "console-users", "PGBOX_CONSOLE_USERS", "",
		"console basic-auth logins, comma-separated name:bcrypt-hash (htpasswd -nbB -C 12 name password); viewers unless in --console-operators").secret = true
	s.str(&o.Token, groupConsole, "console-token", "PGBOX_CONSOLE_TOKEN", "",
		"console bearer token (at least 16 characters; never printed; prefer the environment variable); its holder is named \"token\"").secret = true
	s.csv(&o.Operators, groupConsole, "console-operators", "PGBOX_CONSOLE_OPERATORS", "",
		"basic-auth users and \"token\" with the console's operator role: retry, discard, replay (proxy users: --console-proxy-operators)")
	s.str(&o.ProxyHeader, groupConsole, "console-proxy-header", "PGBOX_CONSOLE_PROXY_HEADER", "",
		"request header naming the user, set by a reverse proxy on loopback that authenticated them (empty: none)")
	s.csv(&o.ProxyOps, groupConsole, "console-proxy-operators", "PGBOX_CONSOLE_PROXY_OPERATORS", "",
		"users named by --console-proxy-header with the console's operator role (a list of its own: a proxy user is never taken for a basic-auth user or the token)")
	s.boolean(&o.HidePayloads, groupConsole, "console-hide-payloads", "PGBOX_CONSOLE_HIDE_PAYLOADS", false,
		"the console shows no message keys, values or header values (PII)")
}

// auth builds the console's authentication from the settings.
func (o *consoleOptions) auth() (console.Auth, error) {
	role := func(name string) console.Role {
		if slices.Contains(o.Operators, name) {
			return console.RoleOperator
		}
		return console.RoleViewer
	}
	var a console.Auth
	for _, u := range o.Users {
		name, hash, ok := strings.Cut(u, ":")
		if !ok || name == "" || hash == "" {
			return a, errors.New("each entry of PGBOX_CONSOLE_USERS (--console-users) must be name:bcrypt-hash (make one with htpasswd -nbB name password)")
		}
		a.Users = append(a.Users, console.User{Name: name, PasswordHash: hash, Role: role(name)})
	}
	if o.Token != "" {
		a.Tokens = []console.Token{{Name: consoleTokenName, Token: o.Token, Role: role(consoleTokenName)}}
	}
	if o.ProxyHeader != "" {
		a.ProxyHeader = o.ProxyHeader
		a.ProxyOperators = o.ProxyOps
	}
	return a, nil
}

// validate checks the console settings without opening anything.
func (o *consoleOptions) validate() error {
	a, err := o.auth()
	if err != nil {
		return usageError("%v", err)
	}
	if o.ProxyHeader == "" && len(o.ProxyOps) > 0 {
		return usageError("PGBOX_CONSOLE_PROXY_OPERATORS (--console-proxy-operators) is set without PGBOX_CONSOLE_PROXY_HEADER (--console-proxy-header)")
	}
	if o.Token != "" && len(o.Token) < 16 {
		return usageError("PGBOX_CONSOLE_TOKEN (--console-token) must be at least 16 characters")
	}
	if _, err := console.New(console.Config{DB: noDB{}, Auth: a}); err != nil {
		return usageError("PGBOX_CONSOLE_USERS (--console-users): %v", strings.TrimPrefix(err.Error(), "console: "))
	}
	if o.Addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return usageError("invalid value %q for PGBOX_CONSOLE_ADDR (--console-addr): must be host:port, :port or empty (no console)", o.Addr)
	}
	if err := console.CheckListen(o.Addr, a); err != nil {
		return usageError("PGBOX_CONSOLE_ADDR (--console-addr): %v", strings.TrimPrefix(err.Error(), "console: "))
	}
	return nil
}

// noDB stands in for the pool when validate builds a console to check its
// settings; it is never queried.
type noDB struct{ console.DB }

// serveConsole serves the console on the settings' address until ctx ends;
// it returns once the listener is bound.
func (a *app) serveConsole(ctx context.Context, pool *pgxpool.Pool, lk *lazyKafka, r *relay.Relay, cl *cleanup.Cleaner) (<-chan error, error) {
	o := a.opts.Console
	auth, err := o.auth()
	if err != nil {
		return nil, usageError("%v", err)
	}
	cfg := console.Config{DB: pool, Auth: auth, HidePayloads: o.HidePayloads, Logger: a.log.With("component", "console"),
		Inspect:   inspect.Config{Lanes: a.opts.Relay.Lanes},
		Published: func() uint64 { return r.Stats().Published }, CleanupInterval: a.opts.CleanupInterval}
	cc := a.cleanupConfig(nil, lk, false).CutoffsConfig()
	cfg.Inspect.Cutoffs = &cc
	if cl != nil {
		cfg.Cleaner = cl
	}
	h, err := console.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, usageError("PGBOX_CONSOLE_ADDR (--console-addr) %q: %v", o.Addr, err)
	}
	ch := serve(ctx, ln, a.opts.HTTPConnsPerClient, h)
	a.log.Info("console listening", "addr", ln.Addr().String(), "users", len(auth.Users), "token", auth.Tokens != nil,
		"proxy_header", auth.ProxyHeader, "hide_payloads", o.HidePayloads)
	return ch, nil
}
