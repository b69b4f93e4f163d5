package outbox

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before the next publish attempt of a row that
// has failed retry+1 times: base doubled retry times, capped at ceiling,
// then shortened by up to the jitter fraction so that rows failing together
// do not retry together. The result lies in [d*(1-jitter), d] where d is the
// capped delay, so it never exceeds ceiling.
//
// A negative retry counts as 0; jitter is clamped to [0, 1]; ceiling <= 0
// means no cap; rnd returns a number in [0, 1), and nil means math/rand/v2.
func Backoff(retry int, base, ceiling time.Duration, jitter float64, rnd func() float64) time.Duration {
	if base <= 0 {
		return 0
	}
	if ceiling <= 0 {
		ceiling = math.MaxInt64
	}
	retry = min(max(retry, 0), 62)
	d := ceiling
	if base <= ceiling>>retry { // base<<retry neither overflows nor passes the cap
		d = base << retry
	}
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
