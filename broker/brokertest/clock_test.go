package brokertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestClock(t *testing.T) {
	t.Parallel()
	c := brokertest.NewClock(brokertest.Epoch)
	require.Equal(t, brokertest.Epoch, c.Now())

	now := c.After(0)
	require.Equal(t, brokertest.Epoch, <-now, "a due timer fires at once")

	a, b := c.After(time.Second), c.After(2*time.Second)
	require.Equal(t, 2, c.Timers())
	c.Advance(time.Second - 1)
	requireNone(t, a)
	c.Advance(1)
	require.Equal(t, brokertest.Epoch.Add(time.Second), <-a)
	requireNone(t, b)
	require.Equal(t, 1, c.Timers())
	c.Advance(time.Hour)
	require.Equal(t, brokertest.Epoch.Add(time.Hour+time.Second), <-b)
	require.Zero(t, c.Timers())
}

func TestClockWaitTimers(t *testing.T) {
	t.Parallel()
	c := brokertest.NewClock(brokertest.Epoch)
	ctx := testwait.Context(t)
	armed := make(chan (<-chan time.Time))
	go func() { armed <- c.After(time.Minute) }()
	require.NoError(t, c.WaitTimers(ctx, 1))
	ch := testwait.Recv(t, "the timer armed", armed)
	c.Advance(time.Minute)
	testwait.Recv(t, "the timer to fire", ch)

	short, cancelShort := context.WithCancel(context.Background())
	cancelShort()
	require.ErrorIs(t, c.WaitTimers(short, 1), context.Canceled)
}

func requireNone(t *testing.T, ch <-chan time.Time) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("timer fired early at %s", v)
	default:
	}
}
