package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Delay returns the wait after the failures-th failure (1-based): base after
// the first, multiplied by factor for each further one, saturating at the
// largest time.Duration instead of overflowing, capped at ceiling, then
// shortened by up to the jitter fraction so that things failing together do
// not retry together. The result lies in [d*(1-jitter), d] where d is the
// capped delay, so it never exceeds ceiling.
//
// failures below 1 count as 1; factor below 1 (or NaN) counts as 1;
// ceiling <= 0 means no cap; jitter is clamped to [0, 1] (NaN is 0); rnd
// returns a number in [0, 1), and nil means math/rand/v2. base <= 0 waits 0.
func Delay(failures int, base time.Duration, factor float64, ceiling time.Duration, jitter float64, rnd func() float64) time.Duration {
	if base <= 0 {
		return 0
	}
	if ceiling <= 0 {
		ceiling = math.MaxInt64
	}
	if !(factor >= 1) {
		factor = 1
	}
	// Powers of two scale a float64 exactly, so doubling keeps whole
	// nanoseconds up to the cap; the loop stops as soon as the cap is
	// reached, so a huge failures count costs nothing.
	d := float64(base)
	for i := 1; i < failures && d < float64(ceiling); i++ {
		d *= factor
	}
	out := ceiling
	if d < float64(ceiling) {
		out = time.Duration(d)
	}
	return Jitter(out, jitter, rnd)
}

// Jitter shortens d by up to the fraction jitter: d - d*jitter*rnd(). See
// [Delay] for the ranges.
func Jitter(d time.Duration, jitter float64, rnd func() float64) time.Duration {
	if !(jitter > 0) { // also NaN
		return d
	}
	jitter = min(jitter, 1)
	if rnd == nil {
		rnd = rand.Float64
	}
	r := rnd()
	if !(r > 0) {
		return d
	}
	cut := float64(d) * jitter * min(r, 1)
	if cut >= float64(d) {
		return 0
	}
	return d - time.Duration(cut)
}
