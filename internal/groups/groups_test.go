package groups

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// failingSource fails its first fails Waits, then blocks until canceled.
// Only Wait is ever called on it: the consumer gets no delivery to settle.
type failingSource struct {
	Source
	fails     int
	waits     int
	exhausted chan struct{}
}

func (f *failingSource) Wait(ctx context.Context, _, _ string) (broker.Delivery, error) {
	f.waits++
	if f.waits <= f.fails {
		return broker.Delivery{}, errors.New("broker down")
	}
	if f.waits == f.fails+1 {
		f.exhausted <- struct{}{}
	}
	<-ctx.Done()
	return broker.Delivery{}, ctx.Err()
}

func TestConsumerBacksOffOnFailingWait(t *testing.T) {
	// The pauses are read through the injected clock, which fires at once:
	// the test asserts what was asked for, not how long it took.
	var pauses []time.Duration
	src := &failingSource{fails: 10, exhausted: make(chan struct{}, 1)}
	c := New(Options{Source: src, Clock: clock.Funcs{AfterFunc: func(d time.Duration) <-chan time.Time {
		pauses = append(pauses, d)
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 1)
	go func() {
		defer func() { done <- struct{}{} }()
		c.consume(ctx, ctx, Group{Handler: "h", Stream: "s"})
	}()
	testwait.Recv(t, "the consumer past its failing waits", src.exhausted)
	cancel()
	testwait.Recv(t, "the consumer to return once canceled", done)
	ms := time.Millisecond
	require.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms,
		5 * time.Second, 5 * time.Second, 5 * time.Second}, pauses)
}
