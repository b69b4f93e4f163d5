package clock

import "time"

// Clock is the time a component reads and waits on.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// System is the wall clock: time.Now and time.After.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Or returns c, or System when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return System
	}
	return c
}

// Funcs is a Clock of two functions, for a test that fakes one of them;
// a nil function is the system's.
type Funcs struct {
	NowFunc   func() time.Time
	AfterFunc func(time.Duration) <-chan time.Time
}

// Now calls NowFunc, or time.Now.
func (f Funcs) Now() time.Time {
	if f.NowFunc == nil {
		return time.Now()
	}
	return f.NowFunc()
}

// After calls AfterFunc, or time.After.
func (f Funcs) After(d time.Duration) <-chan time.Time {
	if f.AfterFunc == nil {
		return time.After(d)
	}
	return f.AfterFunc(d)
}
