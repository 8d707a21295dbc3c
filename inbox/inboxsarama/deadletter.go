package inboxsarama

import "github.com/pgbox/pgbox/inbox/internal/consume"

// Headers added to a dead-letter record, after the original record's own.
// Both consumer adapters write the same ones.
const (
	HeaderDLQError          = consume.HeaderDLQError          // the last error's text (at most 4 KiB)
	HeaderDLQAttempts       = consume.HeaderDLQAttempts       // attempts made, decimal
	HeaderDLQSourceTopic    = consume.HeaderDLQSourceTopic    // the topic consumed
	HeaderDLQSourceTopicID  = consume.HeaderDLQSourceTopicID  // its id, when known
	HeaderDLQSourcePart     = consume.HeaderDLQSourcePart     // its partition, decimal
	HeaderDLQSourceOffset   = consume.HeaderDLQSourceOffset   // its offset, decimal
	HeaderDLQConsumer       = consume.HeaderDLQConsumer       // inbox.Inbox.Consumer()
	HeaderDLQKey            = consume.HeaderDLQKey            // the inbox key, when the record had one
	HeaderDLQContentDropped = consume.HeaderDLQContentDropped // why the value and original headers were left out
)
