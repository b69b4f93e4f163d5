package lifecycle_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/lifecycle"
)

func TestWaitSoft(t *testing.T) {
	done := make(chan struct{})
	close(done)
	canceled := false
	require.NoError(t, lifecycle.Wait(context.Background(), done, func() { canceled = true }))
	require.False(t, canceled, "a stop that drained in time cancels nothing")
}

func TestWaitHardReturnsWhenTheCanceledWorkReturns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	err := lifecycle.Wait(ctx, done, func() { close(done) })
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, errors.Is(err, lifecycle.ErrAbandoned))
}

func TestWaitHardAbandonsWorkThatIgnoresTheCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	err := lifecycle.Wait(ctx, make(chan struct{}), func() { called = true })
	require.True(t, called)
	require.ErrorIs(t, err, lifecycle.ErrAbandoned)
	require.ErrorIs(t, err, context.Canceled)
}
