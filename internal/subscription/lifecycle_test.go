package subscription_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/position"
)

// blocking handles nothing until its context ends.
type blocking struct{ entered chan struct{} }

func (b *blocking) Handle(ctx context.Context, _ delivery.Batch) (int, error) {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

func lifecycleConsumer(t *testing.T, h *harness, handler delivery.Handler) *subscription.Consumer {
	c, err := subscription.NewConsumer(subscription.Options{
		Events: h.events, Positions: h.positions, Leases: h.leases, Failures: h.failures, Handler: handler,
		Skip: func(ctx context.Context, f position.Fence) error { _, err := h.uow.CommitFenced(ctx, f); return err },
		Subscriptions: func() []subscription.Subscription {
			return []subscription.Subscription{{Group: "g", Category: "order"}}
		},
		Owner: "host-a", Poll: 10 * time.Millisecond,
	})
	require.NoError(t, err)
	return c
}

// Stop before Start and a second Stop are no-ops; Start after Stop fails.
func TestConsumerStopBeforeStartAndTwice(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	c := lifecycleConsumer(t, h, newRecorder(h.uow))
	require.NoError(t, c.Stop(t.Context()))
	require.NoError(t, c.Stop(t.Context()))
	require.Error(t, c.Start(t.Context()))

	c = lifecycleConsumer(t, h, newRecorder(h.uow))
	require.NoError(t, c.Start(t.Context()))
	require.Error(t, c.Start(t.Context()), "a second Start")
	require.NoError(t, c.Stop(t.Context()))
	require.NoError(t, c.Stop(t.Context()))
}

// The hard phase: a batch in hand that does not finish by Stop's deadline
// is canceled, Stop returns the deadline's error, and the lease is
// released for the next owner.
func TestConsumerStopCancelsAtItsDeadline(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	appendEvents(t, h.events, "order", []string{"a"}, 1)
	b := &blocking{entered: make(chan struct{}, 1)}
	c := lifecycleConsumer(t, h, b)
	require.NoError(t, c.Start(t.Context()))
	testwait.Recv(t, "the batch in hand", b.entered)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Stop(ctx), context.DeadlineExceeded)
	_, _, ok, err := h.leases.Holder(t.Context(), "g", "order")
	require.NoError(t, err)
	require.False(t, ok, "the lease is released")
}
