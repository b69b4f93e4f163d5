package relay

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/outbox"
)

// The loop marks the rows it holds published and unmarked (a clean pass
// leaves them to the next claim) on its way out, when a stop comes
// before that claim.
func TestLoopMarksWhatItHoldsAtExit(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	require.NoError(t, store.Add(ctx, []outbox.Row{{MessageID: "00000000-0000-4000-8000-000000000001", Stream: "order-1", Type: "T",
		Data: json.RawMessage(`{}`), TargetBroker: "default"}}))
	claimed, err := store.Claim(ctx, "default", "r1", 10, DefaultOptions().LockFor)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	r := New(store, Options{Broker: "default", Owner: "r1"})
	r.hold(&r.unmarked, []int64{claimed[0].ID}, nil) // published by a clean pass
	soft, stop := context.WithCancel(ctx)
	stop()
	r.loop(soft, ctx)
	got, err := store.Get(ctx, claimed[0].ID)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPublished, got.Status)
}
