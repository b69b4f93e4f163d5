package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	esub "github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

// With event-store subscriptions, a min_position wait does not count an
// event its subscription recorded as failed as handled, though the
// subscription's position passed it: the wait ends at once with a
// *FailedError naming the event. Set to retry, it is waited for; resolved
// or skipped, it counts as handled.
func TestWaitHandledFailedEvent(t *testing.T) {
	var failures *esub.MemoryFailures
	var uow *unitofwork.UnitOfWork
	e, mem, _ := startExamples(t, func(mem *unitofwork.Memory) Options {
		failures = &esub.MemoryFailures{Positions: mem.Positions}
		uow = unitofwork.New(mem, unitofwork.Options{Broker: "default"})
		return Options{Events: mem.Events, Records: mem.Records, UnitOfWork: uow,
			EventStore: true, Progress: &esub.Progress{Positions: mem.Positions, Failures: failures}}
	})

	ctx := context.Background()
	place := func(i int) int64 {
		res, err := e.Dispatch(ctx, "PlaceOrder", json.RawMessage(fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i)), abi.Metadata{})
		require.NoError(t, err)
		return res.Events[0].GlobalPosition
	}
	p1, p2, p3 := place(1), place(2), place(3)
	row, err := mem.Positions.Claim(ctx, "client_orders", "order")
	require.NoError(t, err)
	fence := func(pos int64) position.Fence {
		return position.Fence{Group: "client_orders", Unit: "order", Generation: row.Generation, Advance: map[string]int64{"order": pos}}
	}
	park := func(pos int64, i int) {
		require.NoError(t, failures.Park(ctx, esub.Failure{Group: "client_orders", Unit: "order", GlobalPosition: pos,
			MessageID: "m", Stream: fmt.Sprintf("order-o-%d", i), Type: "OrderPlaced", Status: esub.StatusFailed, Attempts: 1, Error: "boom"}, fence(pos)))
	}
	// The subscription failed p1, recorded it and went on: p2 committed.
	park(p1, 1)
	_, err = uow.CommitFenced(ctx, fence(p2))
	require.NoError(t, err)

	err = waitFor(e, "client_orders", p2, time.Minute)
	require.ErrorIs(t, err, readyourwrites.ErrFailed, "a failed event below the wait is not handled")
	var fe *esub.FailedError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, p1, fe.Failure.GlobalPosition)
	require.Contains(t, err.Error(), fmt.Sprintf("projection client_orders cannot reach global position %d: its handler failed the OrderPlaced event at global position %d", p2, p1))

	require.NoError(t, failures.Mark(ctx, "client_orders", "order", p1, esub.ActionRetry))
	require.ErrorIs(t, waitFor(e, "client_orders", p2, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "a rerun on its way is waited for")
	require.NoError(t, failures.Resolve(ctx, "client_orders", "order", p1, esub.StatusResolved, 2, ""))
	require.NoError(t, waitFor(e, "client_orders", p2, time.Minute), "a resolved event is handled")

	park(p3, 3)
	require.ErrorIs(t, waitFor(e, "client_orders", p3, time.Minute), readyourwrites.ErrFailed)
	require.NoError(t, waitFor(e, "client_orders", p2, time.Minute), "the failure is above this wait")
	require.NoError(t, failures.Mark(ctx, "client_orders", "order", p3, esub.ActionSkip))
	require.NoError(t, waitFor(e, "client_orders", p3, time.Minute), "a skipped event counts as handled: the operator gave it up")
}
