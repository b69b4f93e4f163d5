package engine

import "time"

// after returns a channel that fires once d has passed: the engine's
// injected clock for retry pauses, time.After unless a test set one.
func (e *Engine) after(d time.Duration) <-chan time.Time {
	if e.afterFn != nil {
		return e.afterFn(d)
	}
	return time.After(d)
}
