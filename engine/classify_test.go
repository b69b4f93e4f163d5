package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
)

// downEvents is an event store whose reads fail as a database that is
// down does.
type downEvents struct{ eventstore.Store }

var errDown = errors.New("failed to connect to `host=127.0.0.1`: dial error: connection refused")

func (downEvents) ReadStream(context.Context, string, int64, int) ([]eventstore.Event, error) {
	return nil, errDown
}

// A guest that fails because a host function's store call failed on the
// database passed the outage on: the failure is infrastructure, whatever
// kind the guest gave it, so it is retried without end and never charged
// to the message (it halted partitions on a PostgreSQL restart before).
// A guest's own failure stays the message's.
func TestGuestFailureAfterAStoreOutageIsInfrastructure(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	e.opts.Events = downEvents{mem.Events}

	done, err := e.Partitions().Handle(ctx, opBatch(row.Generation, "read"))
	require.Equal(t, 0, done)
	var he *HandlerError
	require.ErrorAs(t, err, &he, "the guest's failure")
	require.ErrorIs(t, err, errDown, "keeps the store's error as its cause")
	require.Equal(t, delivery.Infrastructure, Classify(err))

	e.opts.Events = mem.Events
	_, err = e.Partitions().Handle(ctx, opBatch(row.Generation, "transient"))
	require.Equal(t, delivery.Retry, Classify(err), "a guest's own transient failure")
	_, err = e.Partitions().Handle(ctx, opBatch(row.Generation, "rejected"))
	require.Equal(t, delivery.Permanent, Classify(err), "a guest's own rejection")
}

// A call that fails as a whole (a trap) on a run of several messages is
// not charged to the run's first message: the handler runs the first
// alone, which commits, and only the message that traps alone fails, as
// the inline path does (TestInlineRunThatTrapsIsRedeliveredOneByOne).
func TestPartitionRunThatTrapsChargesOnlyTheGuilty(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	h := e.Partitions()
	b := opBatch(row.Generation, "read", "stack", "read")

	done, err := h.Handle(ctx, b)
	require.NoError(t, err, "the innocent first message is not blamed")
	require.Equal(t, 1, done)
	require.Equal(t, []string{"1"}, seen(t, mem))

	rest := b
	rest.Messages = b.Messages[1:]
	done, err = h.Handle(ctx, rest)
	require.Equal(t, 0, done)
	require.Error(t, err)
	require.Equal(t, delivery.Permanent, Classify(err), "the trap alone is the message's own failure")

	rest.Messages = b.Messages[2:]
	done, err = h.Handle(ctx, rest)
	require.NoError(t, err)
	require.Equal(t, 1, done)
	require.Equal(t, []string{"1", "3"}, seen(t, mem))
}
