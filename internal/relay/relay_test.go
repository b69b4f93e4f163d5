package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/lifecycle"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// fakeBroker records what it is asked to publish and fails while fail is set.
type fakeBroker struct {
	mu   sync.Mutex
	caps broker.Capability
	fail error
	got  []delivery.Message
}

func (b *fakeBroker) Publish(_ context.Context, msgs ...delivery.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	b.got = append(b.got, msgs...)
	return nil
}

func (b *fakeBroker) Capabilities() broker.Capability { return b.caps }

func (b *fakeBroker) streams() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.got {
		out = append(out, m.Stream)
	}
	return out
}

func key(s string) *string { return &s }

// refused is a publish the broker refuses for the message's own sake (it
// counts towards the row's retries); any other publish error is the
// broker's (down, restarting) and counts nothing.
var refused = fmt.Errorf("message too large: %w", broker.ErrInvalid)

func row(id, stream string, k *string, prio int) outbox.Row {
	return outbox.Row{MessageID: id, Stream: stream, Type: "T", Data: json.RawMessage(`{}`), PartitionKey: k, Priority: prio,
		TargetBroker: "default", Metadata: json.RawMessage(`{"position": 3, "global_position": 9, "time": "2026-11-30T00:00:00Z"}`)}
}

func TestPublishesAndRoutes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		caps  broker.Capability
		lanes bool
		want  []string
	}{
		{"inline: the category", 0, false, []string{"order", "order", "payment"}},
		{"partitioning: {category}:{key}", broker.StreamPartitioning, false, []string{"order:c-1", "order:c-2", "payment"}},
		{"lanes: low priority to the backfill lane", broker.StreamPartitioning, true, []string{"order:c-1", "order:c-2:backfill", "payment"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := outbox.NewMemory(nil)
			require.NoError(t, store.Add(ctx, []outbox.Row{
				row("00000000-0000-4000-8000-000000000001", "order-1", key("c-1"), 5),
				row("00000000-0000-4000-8000-000000000002", "order-2", key("c-2"), 0),
				row("00000000-0000-4000-8000-000000000003", "payment-1", nil, 0),
			}))
			b := &fakeBroker{caps: tc.caps}
			r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, LanesEnabled: tc.lanes, LaneThreshold: 1})
			n, err := r.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 3, n)
			require.ElementsMatch(t, tc.want, b.streams())
			for _, m := range b.got {
				require.Equal(t, int64(3), m.Position)
				require.Equal(t, int64(9), m.GlobalPosition)
			}
			st, err := store.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, 3, st.Counts[outbox.StatusPublished])
		})
	}
}

// relayStore is what the relay tests need of a store.
type relayStore interface {
	outbox.RelayStore
	outbox.Store
	adder
}

// stores runs a relay test on the memory store and on PostgreSQL, each
// with the test's clock.
func stores(t *testing.T, test func(t *testing.T, newStore func(clock func() time.Time) relayStore)) {
	t.Run("memory", func(t *testing.T) {
		test(t, func(clock func() time.Time) relayStore { return outbox.NewMemory(clock) })
	})
	t.Run("postgres", func(t *testing.T) {
		pool := testserver.PostgresPool(t)
		test(t, func(clock func() time.Time) relayStore { return outbox.NewPostgres(pool, clock) })
	})
}

func TestFailuresBackOffThenAbandon(t *testing.T) {
	stores(t, testFailuresBackOffThenAbandon)
}

func testFailuresBackOffThenAbandon(t *testing.T, newStore func(clock func() time.Time) relayStore) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := newStore(clock)
	r0 := row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)
	r0.MaxRetries = 3
	require.NoError(t, store.Add(ctx, []outbox.Row{r0}))
	b := &fakeBroker{fail: refused}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b,
		BaseDelay: time.Second, MaxDelay: time.Minute, Clock: at(clock), Rand: func() float64 { return 0.5 }})

	var delays []time.Duration
	for attempt := 1; attempt <= 3; attempt++ {
		n, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n, "attempt %d", attempt)
		got, err := store.Get(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, refused.Error(), got.LastError)
		if got.Status == outbox.StatusAbandoned {
			require.Equal(t, 3, attempt)
			break
		}
		require.Equal(t, outbox.StatusFailed, got.Status)
		delays = append(delays, got.NextRetryAt.Sub(now))
		// Not due yet: nothing to claim.
		n, err = r.RunOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		now = *got.NextRetryAt
	}
	require.Len(t, delays, 2)
	require.Greater(t, delays[1], delays[0], "the delay grows")
	got, err := store.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusAbandoned, got.Status)
}

func TestAbandonsInvalidKeyOnPartitioningBroker(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", key("a:b"), 0)}))
	b := &fakeBroker{caps: broker.StreamPartitioning}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b})
	_, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, b.streams(), "no publish attempt")
	got, err := store.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusAbandoned, got.Status)
	require.Contains(t, got.LastError, "Invalid partition key: partition key contains a colon")

	// On a broker without partitioning the key is carried, not applied.
	store = outbox.NewMemory(nil)
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", key("a:b"), 0)}))
	b = &fakeBroker{}
	_, err = relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b}).RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"order"}, b.streams())
}

func TestStartStop(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	b := &fakeBroker{}
	unstarted := relay.New(store, relay.Options{Broker: "default", Owner: "r0", Publisher: b})
	require.NoError(t, unstarted.Stop(ctx), "stop before start")
	require.ErrorIs(t, unstarted.Start(ctx), lifecycle.ErrStopped, "a relay starts once, as every component does")
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Tick: time.Hour})
	require.NoError(t, r.Start(ctx))
	require.ErrorIs(t, r.Start(ctx), lifecycle.ErrStarted, "double start")
	for i := 1; i <= 20; i++ {
		require.NoError(t, store.Add(ctx, []outbox.Row{row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), nil, 0)}))
		r.Notify() // a commit wakes the relay well before its hour-long tick
	}
	testwait.For(t, "the 20 rows published", func() (bool, string) {
		got := b.streams()
		return len(got) == 20, fmt.Sprintf("%d published: %v", len(got), got)
	})
	require.NoError(t, r.Stop(ctx))
	require.NoError(t, r.Stop(ctx), "double stop")
	require.ErrorIs(t, r.Start(ctx), lifecycle.ErrStopped, "start after stop")
}

// A failing row holds back the rest of its key's run, in the same pass and
// until its retry; other keys' rows go out.
func TestFailureHoldsBackItsKeyOnly(t *testing.T) {
	stores(t, testFailureHoldsBackItsKeyOnly)
}

func testFailureHoldsBackItsKeyOnly(t *testing.T, newStore func(clock func() time.Time) relayStore) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := newStore(clock)
	var rows []outbox.Row
	for i, k := range []string{"A", "A", "B", "A", "B"} {
		rows = append(rows, row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), fmt.Sprintf("order-%d", i+1), key(k), 0))
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &failFirst{fakeBroker: fakeBroker{caps: broker.StreamPartitioning}, failID: rows[0].MessageID}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, BaseDelay: time.Second, Clock: at(clock)})
	n, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n, "both keys' runs were claimed")
	require.Equal(t, []string{"order:B", "order:B"}, b.streams(), "only B's rows went out")
	for id, want := range map[int64]outbox.Status{1: outbox.StatusFailed, 2: outbox.StatusPending, 3: outbox.StatusPublished, 4: outbox.StatusPending, 5: outbox.StatusPublished} {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, got.Status, "row %d", id)
	}
	n, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "A waits for its head's retry")

	now = now.Add(time.Hour)
	b.failID = ""
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"order:B", "order:B", "order:A", "order:A", "order:A"}, b.streams())
	var ids []string
	for _, m := range b.got[2:] {
		ids = append(ids, m.EventStream)
	}
	require.Equal(t, []string{"order-1", "order-2", "order-4"}, ids, "A's rows in commit order")
}

// failFirst fails the publish of one message id.
type failFirst struct {
	fakeBroker
	failID string
}

func (b *failFirst) Publish(ctx context.Context, msgs ...delivery.Message) error {
	for _, m := range msgs {
		if m.ID == b.failID {
			return fmt.Errorf("broker refused %s: %w", m.ID, broker.ErrInvalid)
		}
	}
	return b.fakeBroker.Publish(ctx, msgs...)
}

func TestCleanupHonoursRetention(t *testing.T) {
	stores(t, testCleanupHonoursRetention)
}

func testCleanupHonoursRetention(t *testing.T, newStore func(clock func() time.Time) relayStore) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := newStore(clock)
	var rows []outbox.Row
	for i := 1; i <= 3; i++ {
		rows = append(rows, row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), nil, 0))
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &failFirst{fakeBroker: fakeBroker{}, failID: rows[2].MessageID}
	opts := relay.Options{Broker: "default", Owner: "r1", Publisher: b, Clock: at(clock),
		PublishedRetention: time.Hour, AbandonedRetention: 2 * time.Hour}
	r := relay.New(store, opts)
	_, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, store.Abandon(ctx, 3, "operator"))

	now = now.Add(time.Hour - time.Second)
	n, err := r.Cleanup(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is past its retention yet")
	now = now.Add(2 * time.Second)
	n, err = r.Cleanup(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the two published rows, an hour old")
	_, err = store.Get(ctx, 3)
	require.NoError(t, err, "the abandoned row is kept for two hours")
	now = now.Add(time.Hour)
	n, err = r.Cleanup(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = store.Get(ctx, 3)
	require.ErrorIs(t, err, outbox.ErrNotFound)

	// A retention of 0 keeps rows forever.
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000009", "order-9", nil, 0)}))
	keep := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: &fakeBroker{}, Clock: at(clock)})
	_, err = keep.RunOnce(ctx)
	require.NoError(t, err)
	now = now.Add(10000 * time.Hour)
	n, err = keep.Cleanup(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A broker that is down (any publish error but a refusal of the message)
// abandons nothing however long it lasts: every pass releases the rows
// untried and uncounted and reports an infrastructure failure, and once
// the broker is back every row goes out, each key in commit order. (Rows
// were abandoned after max_retries failed publishes, and the key's later
// rows then passed them: an accepted event lost.)
func TestBrokerDownAbandonsNothing(t *testing.T) {
	stores(t, testBrokerDownAbandonsNothing)
}

func testBrokerDownAbandonsNothing(t *testing.T, newStore func(clock func() time.Time) relayStore) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := newStore(clock)
	var rows []outbox.Row
	for i, k := range []string{"A", "B", "A"} {
		r := row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), fmt.Sprintf("order-%d", i+1), key(k), 0)
		r.MaxRetries = 1
		rows = append(rows, r)
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &fakeBroker{caps: broker.StreamPartitioning, fail: errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Clock: at(clock)})
	for pass := range 20 {
		n, err := r.RunOnce(ctx)
		require.Equal(t, 3, n, "pass %d: every row is claimable again", pass)
		require.True(t, delivery.IsInfrastructure(err), "pass %d: %v", pass, err)
		now = now.Add(time.Second)
	}
	for id := int64(1); id <= 3; id++ {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, got.Status, "row %d", id)
		require.Zero(t, got.RetryCount, "row %d: the broker's failures are not the row's", id)
	}
	b.mu.Lock()
	b.fail = nil
	b.mu.Unlock()
	n, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	var ids []string
	for _, m := range b.got {
		ids = append(ids, m.EventStream)
	}
	require.Equal(t, []string{"order-1", "order-2", "order-3"}, ids)
}

// A partitioned row that the broker refuses past its retries is halted,
// not abandoned: it keeps holding back the later rows of its key, pass
// after pass, and is visible as halted. An operator's retry publishes it
// first, then the rest of the key in commit order; a skip (Abandon) lets
// the rest go on without it.
func TestHaltedRowHoldsBackItsKey(t *testing.T) {
	for _, operator := range []string{"retry", "skip"} {
		t.Run(operator, func(t *testing.T) {
			stores(t, func(t *testing.T, newStore func(clock func() time.Time) relayStore) {
				testHaltedRowHoldsBackItsKey(t, newStore, operator)
			})
		})
	}
}

func testHaltedRowHoldsBackItsKey(t *testing.T, newStore func(clock func() time.Time) relayStore, operator string) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := newStore(clock)
	var rows []outbox.Row
	for i, k := range []string{"A", "A", "B", "A"} {
		r := row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), fmt.Sprintf("order-%d", i+1), key(k), 0)
		r.MaxRetries = 2
		rows = append(rows, r)
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &failFirst{fakeBroker: fakeBroker{caps: broker.StreamPartitioning}, failID: rows[0].MessageID}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, BaseDelay: time.Second, Clock: at(clock)})
	for range 6 {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		now = now.Add(time.Hour)
	}
	head, err := store.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusHalted, head.Status)
	require.Contains(t, head.LastError, "broker refused")
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Counts[outbox.StatusHalted])
	require.Len(t, st.Abandoned, 1)
	require.Equal(t, outbox.Abandoned{ID: 1, Status: outbox.StatusHalted, Category: "order", Key: "A", MessageID: rows[0].MessageID,
		TargetBroker: "default", RetryCount: 2, LastError: head.LastError, CreatedAt: head.CreatedAt}, st.Abandoned[0])
	require.Equal(t, []string{"order:B"}, b.streams(), "A's later rows never pass its halted head")

	b.failID = ""
	if operator == "retry" {
		require.NoError(t, store.Retry(ctx, 1))
	} else {
		require.NoError(t, store.Abandon(ctx, 1, "skipped"))
	}
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	var got []string
	for _, m := range b.got {
		got = append(got, m.EventStream)
	}
	want := []string{"order-3", "order-1", "order-2", "order-4"}
	if operator == "skip" {
		want = []string{"order-3", "order-2", "order-4"}
	}
	require.Equal(t, want, got)
}

// A relay whose pass has run too close to the end of its claim (a stalled
// process) publishes nothing under it: the rows go back, for a relay with a
// live claim. (A stalled relay published a row after a successor had
// published the key's later rows.)
func TestDoesNotPublishPastItsClaim(t *testing.T) {
	ctx := context.Background()
	clock := brokertest.NewClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	store := &stallAfterClaim{Memory: outbox.NewMemory(clock.Now), stall: func() {
		clock.Advance(12 * time.Second) // of a 15 s lock: under a quarter left
	}}
	require.NoError(t, store.Add(ctx, []outbox.Row{
		row("00000000-0000-4000-8000-000000000001", "order-1", key("A"), 0),
		row("00000000-0000-4000-8000-000000000002", "order-2", key("A"), 0),
	}))
	b := &fakeBroker{caps: broker.StreamPartitioning}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, LockFor: 15 * time.Second, Clock: at(clock.Now)})
	_, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, b.streams(), "nothing is published under a lapsing claim")
	for id := int64(1); id <= 2; id++ {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPending, got.Status, "row %d released for the next claim", id)
	}
	store.stall = func() {}
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"order:A", "order:A"}, b.streams())
}

// stallAfterClaim runs stall after each claim: the relay's process stalls
// between its claim and its publish.
type stallAfterClaim struct {
	*outbox.Memory
	stall func()
}

func (s *stallAfterClaim) Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]outbox.Row, error) {
	rows, err := s.Memory.Claim(ctx, broker, owner, limit, lockFor)
	s.stall()
	return rows, err
}

func (s *stallAfterClaim) ClaimChained(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes outbox.Lanes) ([]outbox.Row, error) {
	rows, err := s.Memory.ClaimChained(ctx, broker, owner, limit, lockFor, lanes)
	s.stall()
	return rows, err
}

// A claim goes to the broker in one call; when the broker refuses one of
// its messages, the pass publishes them one by one: the refused row is
// charged and holds back its key, the other keys' rows go out.
func TestPublishesAClaimInOneCall(t *testing.T) {
	ctx := context.Background()
	store := outbox.NewMemory(nil)
	var rows []outbox.Row
	for i, k := range []string{"A", "B", "A", "B"} {
		rows = append(rows, row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1), fmt.Sprintf("order-%d", i+1), key(k), 0))
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &countCalls{fakeBroker: fakeBroker{caps: broker.StreamPartitioning}}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b})
	n, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, 1, b.calls, "one publish for the claim")

	for i, k := range []string{"A", "B", "A", "B"} {
		rows[i] = row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+11), fmt.Sprintf("order-%d", i+11), key(k), 0)
	}
	require.NoError(t, store.Add(ctx, rows))
	b.refuse = "00000000-0000-4000-8000-000000000011" // A's first
	b.calls, b.got = 0, nil
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
	var got []string
	for _, m := range b.got {
		got = append(got, m.EventStream)
	}
	require.Equal(t, []string{"order-12", "order-14"}, got, "B's rows go out; A is held back behind its refused row")
	failed, err := store.Get(ctx, 5)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusFailed, failed.Status)
	require.Equal(t, 1, failed.RetryCount)
	later, err := store.Get(ctx, 7)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, later.Status, "A's later row released untried")
}

// countCalls counts publish calls and refuses (broker.ErrInvalid) any call
// holding the message id refuse.
type countCalls struct {
	fakeBroker
	calls  int
	refuse string
}

func (b *countCalls) Publish(ctx context.Context, msgs ...delivery.Message) error {
	b.calls++
	for _, m := range msgs {
		if m.ID == b.refuse {
			return fmt.Errorf("message %s: %w", m.ID, broker.ErrInvalid)
		}
	}
	return b.fakeBroker.Publish(ctx, msgs...)
}

// markFails fails the first MarkPublishedBatch, as a database that went
// away between a publish and its mark does.
type markFails struct {
	relayStore
	mu     sync.Mutex
	failed bool
}

func (s *markFails) MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error {
	s.mu.Lock()
	first := !s.failed
	s.failed = true
	s.mu.Unlock()
	if first {
		return errors.New("write tcp 127.0.0.1:5432: connection reset by peer")
	}
	return s.relayStore.MarkPublishedBatch(ctx, owner, ids)
}

// A pass whose mark failed on the database holds rows it published: the
// next pass marks them before it claims, so their key goes on at once. The
// claim's lock is an hour here, so without that the key's next row (and
// the published rows, marked only once the lock lapsed and they went
// again) would wait the hour.
func TestSettlesWhatItCouldNotMark(t *testing.T) {
	stores(t, testSettlesWhatItCouldNotMark)
}

func testSettlesWhatItCouldNotMark(t *testing.T, newStore func(clock func() time.Time) relayStore) {
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := &markFails{relayStore: newStore(clock)}
	add := func(i int) {
		r := row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%d", i), key("A"), 0)
		require.NoError(t, store.Add(ctx, []outbox.Row{r}))
	}
	add(1)
	b := &fakeBroker{caps: broker.StreamPartitioning}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Clock: at(clock), LockFor: time.Hour})
	n, err := r.RunOnce(ctx)
	require.Equal(t, 1, n)
	require.True(t, delivery.IsInfrastructure(err), "%v", err)
	add(2)
	now = now.Add(time.Second)
	n, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the key's next row is claimed at once")
	for id := int64(1); id <= 2; id++ {
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusPublished, got.Status, "row %d", id)
	}
	var ids []string
	for _, m := range b.got {
		ids = append(ids, m.EventStream)
	}
	require.Equal(t, []string{"order-1", "order-2"}, ids, "each published once, in order")
}
