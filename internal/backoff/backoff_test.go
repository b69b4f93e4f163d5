package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/backoff"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	const s = time.Second
	half := func() float64 { return 0.5 }
	tests := []struct {
		name     string
		failures int
		base     time.Duration
		factor   float64
		ceiling  time.Duration
		jitter   float64
		rnd      func() float64
		want     time.Duration
	}{
		{"first failure waits base", 1, s, 2, 0, 0, nil, s},
		{"second doubles", 2, s, 2, 0, 0, nil, 2 * s},
		{"factor 1.5", 3, s, 1.5, 0, 0, nil, 2250 * time.Millisecond},
		{"factor 1 is constant", 50, s, 1, 0, 0, nil, s},
		{"factor below 1 counts as 1", 5, s, 0.5, 0, 0, nil, s},
		{"NaN factor counts as 1", 5, s, math.NaN(), 0, 0, nil, s},
		{"saturates without a cap", 1000, s, 2, 0, 0, nil, math.MaxInt64},
		{"capped", 1000, s, 2, time.Minute, 0, nil, time.Minute},
		{"jitter after the cap", 1000, s, 2, time.Minute, 0.5, half, 45 * s},
		{"zero base", 3, 0, 2, 0, 0, nil, 0},
		{"failures below 1 count as 1", -3, s, 2, 0, 0, nil, s},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, backoff.Delay(tc.failures, tc.base, tc.factor, tc.ceiling, tc.jitter, tc.rnd))
		})
	}
}
