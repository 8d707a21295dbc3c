//go:build race

package testutil

// Race reports whether the tests were built with the race detector.
const Race = true
