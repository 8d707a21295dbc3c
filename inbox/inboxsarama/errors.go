package inboxsarama

import "github.com/pgbox/pgbox/inbox"

// ErrPermanent is what errors.Is finds in an error made with Permanent. It
// is inbox.ErrPermanent: the franz-go adapter's is the same.
var ErrPermanent = inbox.ErrPermanent

// Permanent marks a handler error as one that retrying cannot fix (a
// malformed payload, a rule violation): the consumer adapter dead-letters the
// message at once instead of retrying it up to Config.MaxAttempts.
// Permanent(nil) is nil. It is inbox.Permanent.
func Permanent(err error) error { return inbox.Permanent(err) }
