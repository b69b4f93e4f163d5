package delivery

import "context"

// Batch is a run of one unit's messages from one source stream, in publish
// order, for one consumer group: what every source (the broker consumer
// groups, the partition workers, the event-store subscriptions) hands its
// Handler.
type Batch struct {
	Group, Unit string
	// Source is the stream the messages come from (a partition stream or
	// its backfill lane), as the positions row names it.
	Source string
	// Generation is the unit's positions-row generation this owner claimed:
	// the fence of every effect transaction.
	Generation int64
	Messages   []Message
}

// Handler handles batches. Handle commits the effects of a prefix of the
// batch's messages, each message's together with the unit's position
// (fenced by Generation), and returns how many it committed and, when that
// is not all of them, the error of the next one. An error wrapping
// position.ErrFenced means a newer owner claimed the unit.
type Handler interface {
	Handle(ctx context.Context, b Batch) (done int, err error)
}
