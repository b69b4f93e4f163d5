package outbox_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/outbox"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	fixed := func(v float64) func() float64 { return func() float64 { return v } }
	const s = time.Second
	tests := []struct {
		name   string
		retry  int
		base   time.Duration
		max    time.Duration
		jitter float64
		rnd    func() float64
		want   time.Duration
	}{
		{"first retry waits base", 0, s, time.Hour, 0, nil, s},
		{"doubles", 1, s, time.Hour, 0, nil, 2 * s},
		{"doubles again", 3, s, time.Hour, 0, nil, 8 * s},
		{"capped", 12, s, time.Hour, 0, nil, time.Hour},
		{"exactly at cap", 2, 15 * time.Minute, time.Hour, 0, nil, time.Hour},
		{"negative retry counts as 0", -4, s, time.Hour, 0, nil, s},
		{"huge retry does not overflow", 1000, s, time.Hour, 0, nil, time.Hour},
		{"huge base capped", 3, math.MaxInt64 / 2, time.Hour, 0, nil, time.Hour},
		{"no cap", 30, s, 0, 0, nil, s << 30},
		{"no cap, overflow saturates", 40, s, 0, 0, nil, math.MaxInt64},
		{"zero base", 3, 0, time.Hour, 0.5, fixed(0.5), 0},
		{"jitter 0 ignores rnd", 2, s, time.Hour, 0, fixed(0.9), 4 * s},
		{"jitter at rnd 0 keeps full delay", 2, s, time.Hour, 0.5, fixed(0), 4 * s},
		{"jitter shortens by fraction", 2, s, time.Hour, 0.5, fixed(0.5), 3 * s},
		{"jitter near 1 shortens by up to the fraction", 2, s, time.Hour, 0.25, fixed(0.999999), 3*s + time.Microsecond},
		{"jitter applies after the cap", 20, s, time.Hour, 0.1, fixed(0.5), time.Hour - 3*time.Minute},
		{"jitter clamped to 1", 1, s, time.Hour, 7, fixed(0.5), s},
		{"full jitter at rnd 1 reaches 0", 1, s, time.Hour, 1, fixed(1), 0},
		{"negative jitter is none", 1, s, time.Hour, -1, fixed(0.5), 2 * s},
		{"NaN jitter is none", 1, s, time.Hour, math.NaN(), fixed(0.5), 2 * s},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, outbox.Backoff(tc.retry, tc.base, tc.max, tc.jitter, tc.rnd))
		})
	}
}

func TestBackoffDefaultRandomStaysInRange(t *testing.T) {
	t.Parallel()
	for retry := range 20 {
		d := outbox.Backoff(retry, time.Second, time.Minute, 0.2, nil)
		full := min(time.Second<<retry, time.Minute)
		require.LessOrEqual(t, d, full)
		require.GreaterOrEqual(t, d, full-full/5)
	}
}
