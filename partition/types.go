package partition

import (
	"context"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/position"
)

// Subscription is one consumer group (a handler) reading partitioned
// categories.
type Subscription struct {
	Group      string
	Categories []string
	// Correlated makes one unit per key value across all Categories (a
	// process manager with sequential_by = true, whose categories are all
	// partitioned by its correlate field); otherwise each category's keys
	// are units of their own.
	Correlated bool
}

// Batch is a run of one unit's messages from one source stream, in publish
// order, for one consumer group.
type Batch struct {
	Group, Unit string
	// Source is the stream the messages come from (a partition stream or
	// its backfill lane), as the positions row names it.
	Source string
	// Generation is the unit's positions-row generation this owner claimed:
	// the fence of every effect transaction.
	Generation int64
	Messages   []broker.Message
}

// Handler handles batches. Handle commits the effects of a prefix of the
// batch's messages, each message's together with the unit's position
// (fenced by Generation), and returns how many it committed and, when that
// is not all of them, the error of the next one. An error wrapping
// position.ErrFenced means a newer owner claimed the unit.
type Handler interface {
	Handle(ctx context.Context, b Batch) (done int, err error)
}

// Positions is the consumer-positions store a new owner claims its unit in.
type Positions interface {
	Claim(ctx context.Context, group, unit string) (position.Row, error)
	position.Reader
}
