// Package pgbox names the release of the module github.com/pgbox/pgbox.
//
// The capabilities live in the packages below it: migrations for the
// schema, inbox for deduplicating what a service consumes, outbox for the
// events it writes, relay for publishing them, cleanup for pruning inbox
// keys, inspect for operators. This package holds only what belongs to the
// module as a whole rather than to one of them: its version. It imports
// nothing, so any package may use it.
package pgbox

// Version is this release of pgbox: the newest version CHANGELOG.md names,
// and what `relay version` prints. What a release may change, and how to
// upgrade, is in docs/upgrading.md.
const Version = "v0.1.0"
