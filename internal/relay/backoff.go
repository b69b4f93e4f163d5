package relay

import (
	"time"

	"github.com/proteanhq/protean-host/internal/backoff"
)

// Backoff returns the delay before the next publish attempt of a row that
// has now failed failures times (1-based, as the relay counts: the row's
// RetryCount before the failure plus one): base after the first failure
// (outbox.base_retry_delay_ms), doubled per further failure, capped at
// ceiling (max_retry_delay_ms), then shortened by up to the jitter fraction
// (backoff_jitter) so that rows failing together do not retry together. The
// result lies in [d*(1-jitter), d] where d is the capped delay.
//
// failures below 1 count as 1; jitter is clamped to [0, 1]; ceiling <= 0
// means no cap; rnd returns a number in [0, 1), and nil means math/rand/v2.
// The arithmetic is [backoff.Delay], shared with the brokers' redelivery.
func Backoff(failures int, base, ceiling time.Duration, jitter float64, rnd func() float64) time.Duration {
	return backoff.Delay(failures, base, 2, ceiling, jitter, rnd)
}
