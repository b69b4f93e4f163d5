package relay_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/outbox"

	pclock "github.com/proteanhq/protean-host/clock"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	fixed := func(v float64) func() float64 { return func() float64 { return v } }
	const s = time.Second
	tests := []struct {
		name     string
		failures int
		base     time.Duration
		max      time.Duration
		jitter   float64
		rnd      func() float64
		want     time.Duration
	}{
		{"first failure waits base", 1, s, time.Hour, 0, nil, s},
		{"doubles", 2, s, time.Hour, 0, nil, 2 * s},
		{"doubles again", 4, s, time.Hour, 0, nil, 8 * s},
		{"capped", 13, s, time.Hour, 0, nil, time.Hour},
		{"exactly at cap", 3, 15 * time.Minute, time.Hour, 0, nil, time.Hour},
		{"failures below 1 count as 1", 0, s, time.Hour, 0, nil, s},
		{"huge failures do not overflow", 1001, s, time.Hour, 0, nil, time.Hour},
		{"huge base capped", 4, math.MaxInt64 / 2, time.Hour, 0, nil, time.Hour},
		{"no cap", 31, s, 0, 0, nil, s << 30},
		{"no cap, overflow saturates", 41, s, 0, 0, nil, math.MaxInt64},
		{"zero base", 4, 0, time.Hour, 0.5, fixed(0.5), 0},
		{"jitter 0 ignores rnd", 3, s, time.Hour, 0, fixed(0.9), 4 * s},
		{"jitter at rnd 0 keeps full delay", 3, s, time.Hour, 0.5, fixed(0), 4 * s},
		{"jitter shortens by fraction", 3, s, time.Hour, 0.5, fixed(0.5), 3 * s},
		{"jitter near 1 shortens by up to the fraction", 3, s, time.Hour, 0.25, fixed(0.999999), 3*s + time.Microsecond},
		{"jitter applies after the cap", 21, s, time.Hour, 0.1, fixed(0.5), time.Hour - 3*time.Minute},
		{"jitter clamped to 1", 2, s, time.Hour, 7, fixed(0.5), s},
		{"full jitter at rnd 1 reaches 0", 2, s, time.Hour, 1, fixed(1), 0},
		{"negative jitter is none", 2, s, time.Hour, -1, fixed(0.5), 2 * s},
		{"NaN jitter is none", 2, s, time.Hour, math.NaN(), fixed(0.5), 2 * s},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, relay.Backoff(tc.failures, tc.base, tc.max, tc.jitter, tc.rnd))
		})
	}
}

func TestBackoffDefaultRandomStaysInRange(t *testing.T) {
	t.Parallel()
	for failures := 1; failures <= 20; failures++ {
		d := relay.Backoff(failures, time.Second, time.Minute, 0.2, nil)
		full := min(time.Second<<(failures-1), time.Minute)
		require.LessOrEqual(t, d, full)
		require.GreaterOrEqual(t, d, full-full/5)
	}
}

// The relay waits base_retry_delay_ms after a row's first failure and
// doubles it per further failure, as config documents (it once waited
// twice that: Backoff was given the failure count where it took the retry
// index).
func TestWaitsBaseAfterFirstFailure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := outbox.NewMemory(clock)
	r0 := row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)
	r0.MaxRetries = 5
	require.NoError(t, store.Add(ctx, []outbox.Row{r0}))
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: &fakeBroker{fail: refused},
		BaseDelay: time.Second, MaxDelay: time.Minute, Clock: at(clock)})
	for failures, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		n, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		got, err := store.Get(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, failures+1, got.RetryCount)
		require.Equal(t, want, got.NextRetryAt.Sub(now), "delay after failure %d", failures+1)
		now = *got.NextRetryAt
	}
}

// at is a clock that reads now and waits on real time.
func at(now func() time.Time) pclock.Clock { return pclock.Funcs{NowFunc: now} }
