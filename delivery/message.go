package delivery

import (
	"encoding/json"
	"time"
)

// Message is one message on a broker stream, as a source hands it to a
// handler in a [Batch].
type Message struct {
	// ID identifies the message (the event's id). A stream holds at most
	// one message per ID (see broker.Inline.Publish).
	ID string
	// Stream is the broker stream the message goes to: for now the event's
	// stream category ("order"), later a partition stream ("order:c-1").
	Stream string
	Type   string
	// Data and Metadata are JSON values, or nil.
	Data     json.RawMessage
	Metadata json.RawMessage
	// EventStream is the event-store stream the event was appended to
	// ("order-o-1"); empty for a message that is not a stored event.
	EventStream string
	// Category is the event's stream category ("order"), which names the
	// partition index ({category}:__partitions__) a partitioned message is
	// registered in. The relay sets it from the outbox row; when empty,
	// brokers take the part of EventStream before the first '-'.
	Category string
	// Position is the event's position in EventStream, GlobalPosition its
	// position in the store.
	Position       int64
	GlobalPosition int64
	// Time is when the event was recorded.
	Time time.Time
	// PartitionKey is the message's sequential_by key; empty for none.
	PartitionKey string
	// Prev is the global position of the message before this one on its
	// partition stream, as the outbox knows it (0: none or unknown). A
	// partition worker that has applied less than Prev on the stream is
	// missing a message: the stream lost it, and the worker halts the key
	// rather than apply this one past it.
	Prev int64
}

// LastGlobalPosition is the global position of the last message of msgs
// that has one (0: none does).
func LastGlobalPosition(msgs []Message) int64 {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].GlobalPosition > 0 {
			return msgs[i].GlobalPosition
		}
	}
	return 0
}
