package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// Under a lease one relay of a broker claims: while a host that died holds
// it nobody claims, at its expiry exactly one of two relays takes it and
// publishes every row, and when that one stops it gives the lease up, so
// the other takes it at its next try, well before the lease would lapse.
func TestOneRelayClaimsUnderTheLease(t *testing.T) {
	stores(t, func(t *testing.T, newStore func(clock func() time.Time) relayStore) {
		ctx := testwait.Context(t)
		clock := brokertest.NewClock(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
		store := newStore(clock.Now)
		const leaseFor = 5 * time.Second
		held, err := store.(outbox.RelayLeaser).HoldRelay(ctx, "default", "a-host-that-died", leaseFor)
		require.NoError(t, err)
		require.True(t, held)
		addRows := func(from, to int) {
			for i := from; i <= to; i++ {
				require.NoError(t, store.Add(ctx, []outbox.Row{row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), nil, 0)}))
			}
		}
		published := func() int {
			st, err := store.Stats(ctx)
			require.NoError(t, err)
			return st.Counts[outbox.StatusPublished]
		}
		addRows(1, 3)

		brokers := []*fakeBroker{{}, {}}
		relays := make([]*relay.Relay, 2)
		for i := range relays {
			// Tick is long: a relay pauses until its next try for the
			// lease, or its renewal.
			relays[i] = relay.New(store, relay.Options{Broker: "default", Owner: fmt.Sprint("r", i), Publisher: brokers[i],
				LeaseFor: leaseFor, Tick: time.Hour, Clock: clock})
			require.NoError(t, relays[i].Start(ctx))
			t.Cleanup(func() { require.NoError(t, relays[i].Stop(context.Background())) })
		}
		// Each relay tries for the lease every LeaseFor/5 = 1 s.
		for range 4 {
			require.NoError(t, clock.WaitTimers(ctx, 2), "both relays waiting for their next try")
			require.Zero(t, published(), "a relay claimed under another's live lease")
			require.False(t, relays[0].Leading() || relays[1].Leading())
			clock.Advance(leaseFor / 5)
		}
		require.NoError(t, clock.WaitTimers(ctx, 2))
		require.Zero(t, published())
		clock.Advance(leaseFor / 5) // the dead host's lease lapses: exactly now

		testwait.For(t, "the three rows published", func() (bool, string) {
			n := published()
			return n == 3, fmt.Sprint(n, " published")
		})
		lead, other := 0, 1
		if relays[1].Leading() {
			lead, other = 1, 0
		}
		require.True(t, relays[lead].Leading())
		require.False(t, relays[other].Leading(), "both relays lead")
		require.Len(t, brokers[lead].streams(), 3)
		require.Empty(t, brokers[other].streams(), "the relay without the lease published")

		// Idle, the holder pauses until its renewal (Tick is an hour): it
		// keeps the lease however long nothing comes.
		for range 12 {
			require.NoError(t, clock.WaitTimers(ctx, 2))
			clock.Advance(leaseFor / 5)
		}
		require.NoError(t, clock.WaitTimers(ctx, 2))
		require.True(t, relays[lead].Leading(), "an idle holder lost the lease")
		require.False(t, relays[other].Leading())

		// The holder stops and gives the lease up: the other takes it at
		// its next try, a fifth of the lease later, long before the lease
		// would lapse. (The holder's pause until its renewal is armed too.)
		require.NoError(t, relays[lead].Stop(ctx))
		addRows(4, 5)
		require.NoError(t, clock.WaitTimers(ctx, 2))
		clock.Advance(leaseFor / 5)
		testwait.For(t, "the two new rows published", func() (bool, string) {
			n := published()
			return n == 5, fmt.Sprint(n, " published")
		})
		require.True(t, relays[other].Leading())
		require.False(t, relays[lead].Leading(), "a stopped relay leads")
		require.Len(t, brokers[other].streams(), 2)
		require.Len(t, brokers[lead].streams(), 3)
	})
}

// Without a lease (LeaseFor 0, the zero Options) a relay claims at once,
// whoever holds the broker's lease.
func TestRelayWithoutALeaseClaims(t *testing.T) {
	ctx := testwait.Context(t)
	store := outbox.NewMemory(nil)
	held, err := store.HoldRelay(ctx, "default", "another-host", time.Hour)
	require.NoError(t, err)
	require.True(t, held)
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
	b := &fakeBroker{}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b})
	require.False(t, r.Leading(), "a relay that has not started")
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })
	require.True(t, r.Leading())
	testwait.For(t, "the row published", func() (bool, string) {
		return len(b.streams()) == 1, fmt.Sprint(b.streams())
	})
}

// A relay without the lease, whose host committed rows (Notify), wakes
// the holder, which passes at once instead of at its next tick: here the
// tick is an hour and the clock does not move.
func TestRelayWithoutTheLeaseWakesTheHolder(t *testing.T) {
	stores(t, func(t *testing.T, newStore func(clock func() time.Time) relayStore) {
		ctx := testwait.Context(t)
		clock := brokertest.NewClock(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
		store := newStore(clock.Now)
		b := &fakeBroker{}
		holder := relay.New(store, relay.Options{Broker: "default", Owner: "holder", Publisher: b, LeaseFor: 5 * time.Second, Tick: time.Hour, Clock: clock})
		require.NoError(t, holder.Start(ctx))
		t.Cleanup(func() { require.NoError(t, holder.Stop(context.Background())) })
		require.NoError(t, clock.WaitTimers(ctx, 1), "the holder idle")
		require.True(t, holder.Leading())
		other := relay.New(store, relay.Options{Broker: "default", Owner: "other", Publisher: &fakeBroker{}, LeaseFor: 5 * time.Second, Tick: time.Hour, Clock: clock})
		require.NoError(t, other.Start(ctx))
		t.Cleanup(func() { require.NoError(t, other.Stop(context.Background())) })
		require.NoError(t, clock.WaitTimers(ctx, 2), "the other relay waiting for its next try")
		require.False(t, other.Leading())

		require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
		// The holder's listener may not listen yet (PostgreSQL drops a
		// notification nobody listens for): wake until it is heard.
		testwait.For(t, "the holder woken by the other relay", func() (bool, string) {
			other.Notify()
			return len(b.streams()) == 1, fmt.Sprint(b.streams())
		})
	})
}
