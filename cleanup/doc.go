// Package cleanup deletes the inbox keys that Kafka can no longer redeliver,
// and the rows the relay and the consumer adapter leave behind.
package cleanup
