package brokertest

import (
	"context"
	"sync"
	"time"
)

// Clock is a fake clock for broker.Options.Now and After: time moves only
// when Advance is called.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []fakeTimer
	changed chan struct{} // closed and replaced when timers are added
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a clock that reads start.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After is time.After on the clock: the channel receives once Advance has
// moved the clock d past the time of the call (at once if d <= 0).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock forward by d and fires the timers that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	clear(c.timers[len(kept):])
	c.timers = kept
}

// Timers returns how many After channels wait for Advance.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitTimers blocks until at least n After channels wait for Advance, or
// ctx is done. Advance a clock only once the goroutine that should wake
// has armed its timer, or it arms the timer from the later time.
func (c *Clock) WaitTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		have, changed := len(c.timers), c.changed
		c.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}
