package engine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
)

// An event-store subscription's batch that reaches the engine after a
// reload took its handler away (the supervisor stops the worker only at
// its next pass, up to a heartbeat later) commits nothing: it used to
// commit the position past every message as "not handled by this group",
// so a handler removed and added back by the next reload (a file replaced
// in two steps under run --watch) never saw those events.
func TestEventStoreBatchOfARemovedHandlerCommitsNothing(t *testing.T) {
	e, mem := partitionEngine(t)
	e.opts.EventStore = true
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops")
	require.NoError(t, err)
	b := opBatch(row.Generation, "read", "read")
	b.Unit, b.Source = "ops", "ops"

	empty, problems := host.NewSet(nil, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	e.Swap(empty)
	done, err := e.Handler().Handle(ctx, b)
	require.ErrorIs(t, err, ErrNotSubscribed)
	require.Zero(t, done)
	row, _, err = mem.Positions.Get(ctx, "behave", "ops")
	require.NoError(t, err)
	require.Zero(t, row.Positions["ops"], "no position past messages nobody handled")
	require.Empty(t, seen(t, mem))
}
