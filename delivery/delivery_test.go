package delivery_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
)

type kind bool

func (k kind) Error() string   { return "kind" }
func (k kind) Retryable() bool { return bool(k) }

func TestClassify(t *testing.T) {
	t.Parallel()
	down := errors.New("connection refused")
	for _, tc := range []struct {
		name string
		err  error
		want delivery.Class
	}{
		{"plain error is the message's, retryable", errors.New("boom"), delivery.Retry},
		{"retryable kind", kind(true), delivery.Retry},
		{"permanent kind", kind(false), delivery.Permanent},
		{"marked infrastructure", delivery.MarkInfrastructure(down), delivery.Infrastructure},
		{"marked, then wrapped in a permanent kind's message", fmt.Errorf("guest: %w", delivery.MarkInfrastructure(down)), delivery.Infrastructure},
		{"canceled", context.Canceled, delivery.Infrastructure},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), delivery.Infrastructure},
	} {
		require.Equal(t, tc.want, delivery.Classify(tc.err), tc.name)
	}
	require.NoError(t, delivery.MarkInfrastructure(nil))
	m := delivery.MarkInfrastructure(down)
	require.Same(t, m, delivery.MarkInfrastructure(m), "marking twice wraps once")
	require.ErrorIs(t, m, down)
}

func TestPolicy(t *testing.T) {
	t.Parallel()
	p := delivery.Policy{MaxRetries: 3, Delay: time.Second, MaxDelay: 5 * time.Second}
	// MaxRetries counts retries after the first attempt: the 4th failure
	// (the 3rd retry's) is the last that is retried... no: failures 1..3
	// are retried, the 4th gives up.
	for f, want := range map[int]bool{1: false, 2: false, 3: false, 4: true, 100: true} {
		require.Equal(t, want, p.GiveUp(delivery.Retry, f), "failures %d", f)
	}
	require.True(t, p.GiveUp(delivery.Permanent, 1))
	require.False(t, p.GiveUp(delivery.Infrastructure, 1_000_000))
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second},
		[]time.Duration{p.Pause(1), p.Pause(2), p.Pause(3), p.Pause(4), p.Pause(60)})
	require.Equal(t, delivery.InfraBase, p.InfraPause(1))
	require.Equal(t, delivery.InfraMax, p.InfraPause(1000))
	j := delivery.Policy{Delay: time.Second, Jitter: 0.5, Rand: func() float64 { return 1 }}
	require.InDelta(t, float64(500*time.Millisecond), float64(j.Pause(1)), float64(time.Millisecond))
	zero := delivery.Policy{}
	require.True(t, zero.GiveUp(delivery.Retry, 1), "MaxRetries 0: one attempt")
}

func TestOutageLogsOnceAndRecovers(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	counted := 0
	o := delivery.NewOutage("relay", slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now }, func() { counted++ })
	require.False(t, o.Down())
	for range 300 {
		o.Fail(errors.New("down"))
		now = now.Add(100 * time.Millisecond)
	}
	require.True(t, o.Down())
	require.Equal(t, 300, counted)
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "infrastructure unavailable"), out)
	require.Equal(t, 0, strings.Count(out, "still unavailable"), "30 s is below one reminder: %s", out)
	now = now.Add(time.Minute)
	o.Fail(errors.New("down"))
	require.Equal(t, 1, strings.Count(buf.String(), "still unavailable"))
	o.OK()
	o.OK()
	require.False(t, o.Down())
	require.Equal(t, 1, strings.Count(buf.String(), "recovered"))
	require.Contains(t, buf.String(), "failures=301")
}
