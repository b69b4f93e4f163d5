package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// heldBroker blocks each Publish until released or its context ends, and
// says when a publish has begun and how it ended.
type heldBroker struct {
	started chan struct{}
	release chan struct{}
	ended   chan error
}

func newHeldBroker() *heldBroker {
	return &heldBroker{started: make(chan struct{}, 1), release: make(chan struct{}), ended: make(chan error, 1)}
}

func (b *heldBroker) Publish(ctx context.Context, _ ...delivery.Message) error {
	b.started <- struct{}{}
	var err error
	select {
	case <-b.release:
	case <-ctx.Done():
		err = ctx.Err()
	}
	b.ended <- err
	return err
}

func (b *heldBroker) Capabilities() broker.Capability { return 0 }

func statusOf(t *testing.T, store *outbox.Memory) map[outbox.Status]int {
	t.Helper()
	st, err := store.Stats(context.Background())
	require.NoError(t, err)
	return st.Counts
}

// Soft: Stop lets the pass in progress finish and mark its row before it
// returns, and starts no other pass.
func TestStopFinishesThePassInProgress(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	b := newHeldBroker()
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Tick: time.Hour})
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
	require.NoError(t, r.Start(ctx))
	testwait.Recv(t, "the publish to begin", b.started)

	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	close(b.release)
	require.NoError(t, testwait.Recv(t, "the publish to end", b.ended), "the soft phase does not cancel the pass")
	require.NoError(t, testwait.Recv(t, "Stop to return", stopped))
	require.Equal(t, 1, statusOf(t, store)[outbox.StatusPublished], "Stop returned before the pass marked its row")
}

// Hard: at Stop's deadline the pass in progress is canceled (its row stays
// claimed until its lock expires) and Stop returns the deadline's error.
func TestStopCancelsThePassAtItsDeadline(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	b := newHeldBroker()
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Tick: time.Hour})
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
	require.NoError(t, r.Start(ctx))
	testwait.Recv(t, "the publish to begin", b.started)

	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, r.Stop(sctx), context.DeadlineExceeded)
	require.ErrorIs(t, testwait.Recv(t, "the publish to end", b.ended), context.Canceled, "the pass was canceled")
	require.Zero(t, statusOf(t, store)[outbox.StatusPublished])
	require.NoError(t, r.Stop(ctx), "a second Stop is a no-op")
}
