package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/delivery"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestInlineConformance(t *testing.T) {
	features := brokertest.Features{
		Ordered:        true,
		HoldTheLine:    true,
		DeadLetters:    true,
		MessageTimeout: true,
		Blocking:       true,
		Stats:          true,
		Deduplicates:   true,
		Clock:          true,
	}
	brokertest.Run(t, features, func(t *testing.T, opts broker.Options) broker.Broker {
		b, err := broker.NewInline(opts)
		require.NoError(t, err)
		return b
	})
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mod  func(*broker.Options)
		want string // "" for valid
	}{
		{"defaults", func(*broker.Options) {}, ""},
		{"no retries", func(o *broker.Options) { o.MaxRetries = 0 }, ""},
		{"no delay", func(o *broker.Options) { o.Delay = 0 }, ""},
		{"negative retries", func(o *broker.Options) { o.MaxRetries = -1 }, "MaxRetries must be >= 0"},
		{"negative delay", func(o *broker.Options) { o.Delay = -time.Second }, "Delay must be >= 0"},
		{"negative cap", func(o *broker.Options) { o.MaxDelay = -time.Second }, "MaxDelay must be >= 0"},
		{"jitter past 1", func(o *broker.Options) { o.Jitter = 1.5 }, "Jitter must be in [0, 1]"},
		{"zero timeout", func(o *broker.Options) { o.MessageTimeout = 0 }, "MessageTimeout must be > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := broker.DefaultOptions()
			tt.mod(&o)
			_, err := broker.NewInline(o)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := broker.NewInline(broker.Options{})
	require.Error(t, err, "the zero Options are not valid: start from DefaultOptions")
}

func TestDefaultOptions(t *testing.T) {
	t.Parallel()
	require.Equal(t, broker.Options{
		Policy:         delivery.Policy{MaxRetries: 3, Delay: time.Second, MaxDelay: time.Minute},
		MessageTimeout: 300 * time.Second,
		EnableDLQ:      true,
	}, broker.DefaultOptions())
}

func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	o := broker.DefaultOptions()
	for retries, want := range map[int]time.Duration{
		0: time.Second, // not reached by Nack; the base delay
		1: time.Second,
		2: 2 * time.Second,
		3: 4 * time.Second,
		4: 8 * time.Second,
	} {
		require.Equal(t, want, o.Pause(retries), "retries %d", retries)
	}
	require.Equal(t, time.Minute, o.Pause(1000), "capped at MaxRetryDelay")
	o.MaxDelay = 0
	require.Equal(t, time.Duration(1<<63-1), o.Pause(1000), "no cap: saturates")
	o.MaxDelay, o.Jitter, o.Rand = time.Minute, 0.5, func() float64 { return 1 }
	require.Equal(t, 30*time.Second, o.Pause(1000), "jitter shortens, at most by its fraction")
	require.InDelta(t, 0.5, o.JitterFactor(), 1e-9, "the factor a script multiplies by")
	o.Jitter = 0
	o.Delay = 0
	require.Zero(t, o.Pause(1000))
}

func TestCapabilityString(t *testing.T) {
	t.Parallel()
	for c, want := range map[broker.Capability]string{
		0:                        "0",
		broker.ReliableMessaging: "ReliableMessaging",
		broker.ReliableMessaging | broker.StreamPartitioning: "ReliableMessaging|StreamPartitioning",
		broker.DeadLetterQueue | 1<<10:                       "DeadLetterQueue|Capability(0x400)",
	} {
		require.Equal(t, want, c.String())
	}
	c := broker.ReliableMessaging | broker.OrderedMessaging
	require.True(t, c.Has(broker.OrderedMessaging))
	require.True(t, c.Has(broker.ReliableMessaging|broker.OrderedMessaging))
	require.False(t, c.Has(broker.OrderedMessaging|broker.BlockingRead))
}

func TestInlineCapabilities(t *testing.T) {
	t.Parallel()
	b, err := broker.NewInline(broker.DefaultOptions())
	require.NoError(t, err)
	defer b.Close()
	c := b.Capabilities()
	require.Equal(t, broker.ReliableMessaging|broker.DeadLetterQueue|broker.OrderedMessaging|broker.BlockingRead, c)
	require.False(t, c.Has(broker.StreamPartitioning), "inline processes in order; it has no partition streams")
}

// DeadLetter finds one dead letter of a group by its message id: not a
// message in flight, not another group's, not one replayed.
func TestInlineDeadLetterFinds(t *testing.T) {
	opts := broker.DefaultOptions()
	opts.MaxRetries = 0
	b, err := broker.NewInline(opts)
	require.NoError(t, err)
	defer b.Close()
	ctx := context.Background()
	require.NoError(t, b.Publish(ctx, delivery.Message{ID: "m1", Stream: "order", Type: "T"}, delivery.Message{ID: "m2", Stream: "order", Type: "T"}))
	var f broker.DeadLetterFinder = b
	find := func(group, id string) (broker.DeadLetter, bool) {
		dl, ok, err := f.DeadLetter(ctx, "order", group, id)
		require.NoError(t, err)
		return dl, ok
	}
	d, err := b.Next(ctx, "order", "g")
	require.NoError(t, err)
	_, ok := find("g", d.ID)
	require.False(t, ok, "in flight")
	require.NoError(t, b.Nack(ctx, "order", "g", d.ID))
	dl, ok := find("g", d.ID)
	require.True(t, ok)
	require.Equal(t, "m1", dl.ID)
	require.Equal(t, broker.ReasonMaxRetries, dl.Reason)
	require.Equal(t, 1, dl.Attempts)
	_, ok = find("other", "m1")
	require.False(t, ok, "another group's")
	_, ok = find("g", "m2")
	require.False(t, ok, "not delivered")
	_, ok = find("g", "nope")
	require.False(t, ok, "unknown")
	require.NoError(t, b.Replay(ctx, "order", "g", "m1"))
	_, ok = find("g", "m1")
	require.False(t, ok, "replayed")
}
