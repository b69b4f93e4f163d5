package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/clock"
)

func TestOrAndFuncs(t *testing.T) {
	t.Parallel()
	require.Equal(t, clock.System, clock.Or(nil))
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	var waited []time.Duration
	fake := clock.Funcs{NowFunc: func() time.Time { return at }, AfterFunc: func(d time.Duration) <-chan time.Time {
		waited = append(waited, d)
		ch := make(chan time.Time, 1)
		ch <- at.Add(d)
		return ch
	}}
	c := clock.Or(fake)
	require.Equal(t, at, c.Now())
	require.Equal(t, at.Add(time.Hour), <-c.After(time.Hour), "the fake's wait, not an hour of real time")
	require.Equal(t, []time.Duration{time.Hour}, waited)

	half := clock.Funcs{NowFunc: func() time.Time { return at }}
	require.Equal(t, at, half.Now())
	select {
	case <-half.After(time.Millisecond): // the system's After
	case <-time.After(time.Minute):
		t.Fatal("the system's After did not fire")
	}
	require.WithinDuration(t, time.Now(), clock.System.Now(), time.Minute)
}
