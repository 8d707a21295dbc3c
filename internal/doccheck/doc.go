// Package doccheck holds the tests that keep pgbox's documentation true: the
// tests docs/guarantees.md cites exist, the defaults docs/operations.md quotes
// are the exported constants, and every metric the docs, docs/alerts.yml and
// docs/dashboard.json name is one pgboxprom exports. It has no code of its own.
package doccheck
