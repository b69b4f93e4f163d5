package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/lifecycle"
)

// A Runner starts once; Stop before Start and a second Stop are no-ops;
// the soft stop lets the loop finish what it holds (work stays live until
// the loop returns).
func TestRunnerStartsOnceAndStopsSoftly(t *testing.T) {
	ctx := context.Background()
	var unstarted lifecycle.Runner
	require.NoError(t, unstarted.Stop(ctx))
	require.ErrorIs(t, unstarted.Start(ctx, func(_, _ context.Context) {}), lifecycle.ErrStopped)

	var r lifecycle.Runner
	finished := make(chan error, 1)
	require.NoError(t, r.Start(ctx, func(soft, work context.Context) {
		<-soft.Done()
		finished <- work.Err() // the work in hand is not canceled by a soft stop
	}))
	require.True(t, r.Running())
	require.ErrorIs(t, r.Start(ctx, func(_, _ context.Context) {}), lifecycle.ErrStarted)
	require.NoError(t, r.Stop(ctx))
	require.NoError(t, <-finished)
	require.False(t, r.Running())
	require.NoError(t, r.Stop(ctx), "a second Stop")
	require.ErrorIs(t, r.Start(ctx, func(_, _ context.Context) {}), lifecycle.ErrStopped)
}

// At Stop's deadline the work is canceled; a loop that ignores it is left
// behind after the grace, and Stop says so.
func TestRunnerHardStop(t *testing.T) {
	var r lifecycle.Runner
	require.NoError(t, r.Start(context.Background(), func(_, work context.Context) { <-work.Done() }))
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err := r.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, lifecycle.ErrAbandoned, "the loop returned once canceled")

	var stuck lifecycle.Runner
	release := make(chan struct{})
	defer close(release)
	require.NoError(t, stuck.Start(context.Background(), func(_, _ context.Context) { <-release }))
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.ErrorIs(t, stuck.Stop(ctx2), lifecycle.ErrAbandoned)
}
