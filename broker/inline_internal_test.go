package broker

import (
	"context"
	"testing"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/stretchr/testify/require"
)

// A Wait blocked before a Publish, Nack or Replay must wake to see the
// message (or to arm a timer for a delayed one). The conformance suite
// cannot make sure the waiter blocked first, so pin the signal itself.
func TestInlineSignalsWaiters(t *testing.T) {
	t.Parallel()
	opts := DefaultOptions()
	opts.MaxRetries, opts.Delay = 1, 0
	b, err := NewInline(opts)
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()

	// wakes runs op and requires it to close the channel a Wait on the
	// order stream would have blocked on.
	wakes := func(what string, op func() error) {
		t.Helper()
		b.mu.Lock()
		ch := b.streamLocked("order").changed
		b.mu.Unlock()
		require.NoError(t, op())
		select {
		case <-ch:
		default:
			require.FailNow(t, what+" did not wake waiters")
		}
	}
	next := func(id string) {
		t.Helper()
		d, err := b.Next(ctx, "order", "g")
		require.NoError(t, err)
		require.Equal(t, id, d.ID)
	}

	wakes("publish", func() error { return b.Publish(ctx, delivery.Message{ID: "m1", Stream: "order"}) })
	next("m1")
	wakes("nack", func() error { return b.Nack(ctx, "order", "g", "m1") })
	next("m1")
	require.NoError(t, b.Nack(ctx, "order", "g", "m1")) // dead
	wakes("replay", func() error { return b.Replay(ctx, "order", "g", "m1") })
	next("m1")
}
