package main

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/pgbox/pgbox/console"
	"github.com/pgbox/pgbox/inspect"
	"github.com/pgbox/pgbox/internal/dbconf"
	"github.com/pgbox/pgbox/relay"
)

// The console of `relay run` with a target list: console.NewFleet over the
// process's targets. A target's pages read its tables through a targetDB
// (its database's pool, its schema per transaction); the fleet overview
// shows the figures the fleetReader last read, the ones /metrics exports:
// a page load reads no database, and the figures are read once for both.

// serveFleetConsole serves the fleet console on --console-addr until ctx
// ends; it returns once the listener is bound. The returned close stops
// the figures' reading under way.
func (fr *fleetRun) serveFleetConsole(ctx context.Context, lk *lazyKafka, reader *fleetReader) (<-chan error, func(), error) {
	a := fr.a
	o := a.opts.Console
	auth, err := o.auth()
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	cc := a.cleanupConfig(nil, lk, false).CutoffsConfig()
	cf := &consoleFleet{fr: fr, reader: reader, redact: map[string]string{}}
	h, err := console.NewFleet(console.FleetConfig{
		Console: console.Config{Auth: auth, HidePayloads: o.HidePayloads, Logger: a.log.With("component", "console"),
			Inspect: inspect.Config{Lanes: a.opts.Relay.Lanes, Cutoffs: &cc}},
		Fleet: cf,
	})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		h.Close()
		return nil, nil, usageError("PGBOX_CONSOLE_ADDR (--console-addr) %q: %v", o.Addr, err)
	}
	ch := serve(ctx, ln, a.opts.HTTPConnsPerClient, h)
	a.log.Info("console listening", "addr", ln.Addr().String(), "users", len(auth.Users), "token", auth.Tokens != nil,
		"proxy_header", auth.ProxyHeader, "hide_payloads", o.HidePayloads, "targets", true)
	return ch, h.Close, nil
}

// consoleFleet is console.Fleet over a fleetRun: its list, the Fleet's
// states, the reader's figures and targetDBs.
type consoleFleet struct {
	fr     *fleetRun
	reader *fleetReader

	mu     sync.Mutex
	redact map[string]string // database URL -> without its password
}

// Targets lists the targets of the list: the Fleet's state of those it
// serves, "refused" with the reason for the others, "starting" for those
// the binary has not checked yet.
func (cf *consoleFleet) Targets() []console.FleetTarget {
	states := map[string]relay.TargetState{}
	for _, s := range cf.fr.f.Targets() {
		states[s.Name] = s
	}
	fr := cf.fr
	fr.mu.Lock()
	list := fr.list
	refused := make(map[string]string, len(fr.refused))
	for name, r := range fr.refused {
		refused[name] = r.err
	}
	fr.mu.Unlock()
	out := make([]console.FleetTarget, 0, len(list))
	for _, t := range list {
		ft := console.FleetTarget{Name: t.Name, Schema: t.Schema, Database: cf.redacted(t.DatabaseURL), State: "starting"}
		if s, ok := states[t.Name]; ok {
			ft.State, ft.Dormant, ft.Lanes, ft.Published = s.State, s.Dormant, s.Stats.Lanes, s.Stats.Published
			if s.Err != nil {
				ft.Err = s.Err.Error()
			}
		} else if err, ok := refused[t.Name]; ok {
			ft.State, ft.Err = targetStateRefused, err
		}
		out = append(out, ft)
	}
	return out
}

// redacted is url without its password, parsed once per database.
func (cf *consoleFleet) redacted(url string) string {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	r, ok := cf.redact[url]
	if !ok {
		r = dbconf.RedactDSN(url)
		cf.redact[url] = r
	}
	return r
}

// DB returns the target's schema over its database's pool: the same value
// while its schema and pool are unchanged.
func (cf *consoleFleet) DB(name string) (console.DB, error) {
	for _, t := range cf.fr.listedPools() {
		if t.spec.Name == name {
			return cf.reader.dbs.get(t.spec, t.pool)
		}
	}
	return nil, fmt.Errorf("target %q: %w", name, console.ErrUnknownTarget)
}

// Summaries is what the reader last read of each target.
func (cf *consoleFleet) Summaries() map[string]console.FleetSummary {
	return cf.reader.summaries()
}
