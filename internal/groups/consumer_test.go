package groups_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/lifecycle"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// recorder is a handler that records each message it handles, per group,
// and blocks on gate (when set) before it returns.
type recorder struct {
	mu      sync.Mutex
	handled map[string][]string
	entered chan string
	gate    chan struct{}
}

func (r *recorder) Handle(_ context.Context, b delivery.Batch) (int, error) {
	if r.entered != nil {
		r.entered <- b.Messages[0].ID
	}
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range b.Messages {
		r.handled[b.Group] = append(r.handled[b.Group], m.ID)
	}
	return len(b.Messages), nil
}

func (r *recorder) of(group string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.handled[group])
}

func classify(error) delivery.Class { return delivery.Retry }

func publish(t *testing.T, b *broker.Inline, stream string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, b.Publish(context.Background(), delivery.Message{ID: id, Stream: stream, Type: "T", Category: stream}))
	}
}

func newInline(t *testing.T) *broker.Inline {
	t.Helper()
	b, err := broker.NewInline(broker.DefaultOptions())
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestResubscribeFollowsTheGroups: a group added by Resubscribe starts
// delivering, and the groups it keeps go on, in order.
func TestResubscribeFollowsTheGroups(t *testing.T) {
	b := newInline(t)
	rec := &recorder{handled: map[string][]string{}}
	var mu sync.Mutex
	want := []groups.Group{{Handler: "a", Stream: "s"}}
	c := groups.New(groups.Options{Source: b, Handler: rec, Classify: classify, Groups: func() []groups.Group {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(want)
	}})
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
	publish(t, b, "s", "m1")
	testwait.For(t, "a to handle m1", func() (bool, string) { return slices.Equal(rec.of("a"), []string{"m1"}), fmt.Sprint(rec.of("a")) })

	mu.Lock()
	want = append(want, groups.Group{Handler: "b", Stream: "t"})
	mu.Unlock()
	c.Resubscribe()
	publish(t, b, "t", "n1", "n2")
	publish(t, b, "s", "m2")
	testwait.For(t, "b to handle its stream, a to go on", func() (bool, string) {
		return slices.Equal(rec.of("b"), []string{"n1", "n2"}) && slices.Equal(rec.of("a"), []string{"m1", "m2"}),
			fmt.Sprint(rec.of("a"), rec.of("b"))
	})
}

// TestStopLetsTheRunInHandSettle: Stop waits for the run in hand, which
// is acked; a Start after Stop is refused.
func TestStopLetsTheRunInHandSettle(t *testing.T) {
	b := newInline(t)
	rec := &recorder{handled: map[string][]string{}, entered: make(chan string, 1), gate: make(chan struct{})}
	c := groups.New(groups.Options{Source: b, Handler: rec, Classify: classify,
		Groups: func() []groups.Group { return []groups.Group{{Handler: "a", Stream: "s"}} }})
	require.NoError(t, c.Start(context.Background()))
	publish(t, b, "s", "m1")
	require.Equal(t, "m1", testwait.Recv(t, "the run in the handler", rec.entered))
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with a run in hand", err)
	default:
	}
	close(rec.gate)
	require.NoError(t, testwait.Recv(t, "Stop to return", stopped))
	require.Equal(t, []string{"m1"}, rec.of("a"))
	st, err := b.Stats(context.Background(), "s", "a")
	require.NoError(t, err)
	require.Equal(t, broker.Stats{}, st, "the run in hand was acked")
	require.ErrorIs(t, c.Start(context.Background()), lifecycle.ErrStopped)
}
