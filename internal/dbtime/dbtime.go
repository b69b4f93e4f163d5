// Package dbtime is time as the stores record it: UTC, to the microsecond,
// which is what PostgreSQL's timestamptz keeps. The memory stores record
// the same, so that both implementations of a store answer the same times
// to the conformance suites.
package dbtime

import "time"

// Clock is a store's injected clock.
type Clock func() time.Time

// NewClock returns now as a Clock; nil means time.Now.
func NewClock(now func() time.Time) Clock {
	if now == nil {
		return time.Now
	}
	return now
}

// Now is the clock's time as recorded.
func (c Clock) Now() time.Time { return Of(c()) }

// Of is t as recorded.
func Of(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
