// Package console is pgbox's operator console: an http.Handler a service
// mounts on its own mux (or `relay run --console-addr` serves) that shows
// what is stuck and fixes it from a browser, safely.
//
// Pages: the overview (outbox backlog per topic and lane, the last hour's
// backlog and publish rate per topic as an SVG chart, relay instances
// and their lanes, parked and dead-letter counts, each consumer's inbox keys
// against their cleanup cutoff, and warnings wherever the dedup guarantee is
// at risk); parked rows and dead letters, filtered by topic, key and error,
// each with its headers and value (as text, JSON or hex), retried,
// discarded or replayed one at a time or all matching a filter; cleanup
// (each topic's rule and the last pass); a key's story (every pgbox row
// that mentions a topic and key, or an event id); and the audit trail.
// Everything it reads and does goes through package inspect, the same
// functions `relay status`, `relay parked` and `relay dead` call.
//
// # Many targets
//
// NewFleet serves the console of every target of a list (a relay.Fleet's
// schemas, described by a Fleet): a fleet overview, one line per target
// with its relay state and figures, the worst first, filtered and paged;
// and each target's pages under /t/{name}/, reading and acting through the
// target's own DB. A page load reads no database for the figures: a
// FleetReader hands its last reads (the binary's, shared with its
// metrics); a FleetSummarizer's are read in the background, a few targets
// at a time, each within FleetConfig.SummaryTimeout, when the overview is
// older than FleetConfig.SummaryMaxAge.
// Logins, roles, the login throttle and HidePayloads are the fleet's; each
// target's forms are signed with its own key and its actions audited in its
// own tables, naming it.
//
// # Security
//
// The console can replay payments, so:
//
//   - CheckListen refuses an address other than loopback unless Auth
//     authenticates someone (basic auth with bcrypt-hashed passwords,
//     bearer tokens, or a header set by a trusted reverse proxy).
//   - Roles: viewers read, operators act. Without authentication every
//     request is an anonymous viewer.
//   - Every action is a POST from the console's own origin
//     (http.CrossOriginProtection) carrying a CSRF token bound to the
//     person (signed with a key all consoles on the database share, table
//     pgbox_console_secret), checks the operator role, touches at most
//     Config.MaxActionRows rows and exactly the rows the operator
//     confirmed (the confirmation lists them; its form carries their ids),
//     and is recorded in the table pgbox_console_audit (migration 00090),
//     with how the person authenticated, before it runs and in the log;
//     the audit page shows the trail. A viewer's attempt is audited as a
//     role refusal, with or without a CSRF token.
//   - Failed logins are logged, audited and, past five per user name or
//     source address, slowed (per process). A success clears only its
//     user's count; behind the trusted proxy the count is per user name
//     only, and requests the proxy authenticated are never slowed. A proxy
//     header with more than one value is refused.
//   - Bad parameters get a 400 naming them; bidi controls in keys, errors
//     and names are shown escaped.
//   - Pages are server-rendered by html/template (payloads are escaped,
//     never interpreted), with a Content-Security-Policy that allows no
//     script at all, frame-ancestors 'none', and Cache-Control: no-store.
//     Config.HidePayloads keeps keys, values and header values off the
//     pages, and what derives from them (keys in error texts, a handler's
//     error text, typed keys in the audit trail). No setting is ever
//     rendered, so no secret can be.
//   - The http.Server a service mounts the handler on should set
//     ReadHeaderTimeout, ReadTimeout and IdleTimeout: the handler answers
//     an unauthenticated POST without reading its body, and a server
//     without a ReadTimeout waits for that body for ever. `relay run`'s
//     servers set them and bound each client address's connections.
package console
