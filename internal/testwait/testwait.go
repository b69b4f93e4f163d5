package testwait

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"
)

// EnvScale names a variable whose value (a positive float) multiplies
// [Limit], for machines slower than the ones the suite was tuned on.
const EnvScale = "PROTEAN_TEST_WAIT_SCALE"

// base is the limit without the race detector: far above anything a
// healthy run needs (a reload under load takes a few seconds), so reaching
// it means the thing is not going to happen.
const base = 60 * time.Second

// poll is how often a condition is checked. Conditions are cheap reads
// (an HTTP GET to a local listener, a map lookup), so polling often costs
// little and keeps tests quick when the code is.
const poll = 10 * time.Millisecond

// Limit is the longest a test waits for something that should happen.
func Limit() time.Duration {
	d := base * raceScale
	if s := os.Getenv(EnvScale); s != "" {
		if f, err := strconv.ParseFloat(s, 64); err == nil && f > 0 {
			d = time.Duration(float64(d) * f)
		}
	}
	return d
}

// Context returns a context that ends at [Limit] from now (or when the
// test ends), for calls that take one and should not block forever.
func Context(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), Limit())
	tb.Cleanup(cancel)
	return ctx
}

// For calls cond on the test goroutine until it reports true or [Limit]
// passes; then it fails tb, naming what it waited for and the last state
// cond reported (seen: what it found instead, e.g. a status code and body,
// or the last log lines).
func For(tb testing.TB, what string, cond func() (ok bool, seen string)) {
	tb.Helper()
	limit := Limit()
	start := time.Now()
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Since(start) > limit {
			tb.Fatalf("testwait: gave up after %s waiting for %s; last seen: %s", limit, what, seen)
		}
		time.Sleep(poll)
	}
}

// True is For with a condition that has nothing to report but its value.
func True(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	For(tb, what, func() (bool, string) { return cond(), "the condition false" })
}

// Recv receives one value from ch, failing tb if none comes within [Limit]
// (or ch is closed).
func Recv[T any](tb testing.TB, what string, ch <-chan T) T {
	tb.Helper()
	limit := Limit()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			tb.Fatalf("testwait: %s: channel closed", what)
		}
		return v
	case <-t.C:
		tb.Fatalf("testwait: gave up after %s waiting for %s", limit, what)
	}
	panic("unreachable")
}
