package inboxsarama

import "github.com/pgbox/pgbox/inbox"

// Headers added to a dead-letter record, after the original record's own.
// They are inbox's (inbox.HeaderDLQError...), which both consumer adapters
// write; these names stay for code written against this package.
const (
	HeaderDLQError          = inbox.HeaderDLQError
	HeaderDLQAttempts       = inbox.HeaderDLQAttempts
	HeaderDLQSourceTopic    = inbox.HeaderDLQSourceTopic
	HeaderDLQSourceTopicID  = inbox.HeaderDLQSourceTopicID
	HeaderDLQSourcePart     = inbox.HeaderDLQSourcePart
	HeaderDLQSourceOffset   = inbox.HeaderDLQSourceOffset
	HeaderDLQConsumer       = inbox.HeaderDLQConsumer
	HeaderDLQKey            = inbox.HeaderDLQKey
	HeaderDLQContentDropped = inbox.HeaderDLQContentDropped
)
