package subscription_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// harness is one backend: the stores a consumer needs and a unit of work.
type harness struct {
	events    eventstore.Store
	positions interface {
		subscription.Positions
		Set(ctx context.Context, group, unit, source string, pos int64) error
	}
	leases   subscription.Leases
	failures subscription.Failures
	uow      *unitofwork.UnitOfWork
	pg       bool
}

func memoryHarness(t *testing.T) *harness {
	m := unitofwork.NewMemory()
	return &harness{events: m.Events, positions: m.Positions, leases: &subscription.MemoryLeases{},
		failures: &subscription.MemoryFailures{Positions: m.Positions}, uow: unitofwork.New(m, unitofwork.Options{Broker: "default"})}
}

func postgresHarness(t *testing.T) *harness {
	pool := testserver.PostgresPool(t)
	p := unitofwork.NewPostgres(pool)
	return &harness{events: p.Events, positions: p.Positions, leases: subscription.NewPostgresLeases(pool),
		failures: subscription.NewPostgresFailures(pool), uow: unitofwork.New(p, unitofwork.Options{Broker: "default"}), pg: true}
}

// onBoth runs fn on a memory and a PostgreSQL harness, in parallel.
func onBoth(t *testing.T, fn func(t *testing.T, h *harness)) {
	for name, newHarness := range map[string]func(t *testing.T) *harness{"memory": memoryHarness, "postgres": postgresHarness} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t))
		})
	}
}

// msgErr is a handler's failure of one message.
type msgErr struct{ retryable bool }

func (e msgErr) Error() string   { return fmt.Sprintf("handler failed (retryable %v)", e.retryable) }
func (e msgErr) Retryable() bool { return e.retryable }

// recorder is a delivery.Handler that commits, per message, a projection
// document with the position, as the engine does, and logs what committed.
type recorder struct {
	uow    *unitofwork.UnitOfWork
	writes atomic.Int64
	mu     sync.Mutex
	// applied is per group, the global positions in commit order.
	applied map[string][]int64
	// fail, if set, fails a message.
	fail func(group string, m delivery.Message) error
	// poison, if set, makes a message's effects a record the stores
	// refuse (poisonData, or a \u0000 in its data): the commit itself
	// fails.
	poison     func(m delivery.Message) bool
	poisonData json.RawMessage
}

func newRecorder(uow *unitofwork.UnitOfWork) *recorder {
	return &recorder{uow: uow, applied: map[string][]int64{}}
}

func (r *recorder) setFail(f func(group string, m delivery.Message) error) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

func (r *recorder) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	r.mu.Lock()
	fail := r.fail
	r.mu.Unlock()
	n, ferr := len(b.Messages), error(nil)
	if fail != nil {
		for i, m := range b.Messages {
			if err := fail(b.Group, m); err != nil {
				n, ferr = i, err
				break
			}
		}
	}
	if r.poison != nil {
		data := r.poisonData
		if data == nil {
			data = json.RawMessage(`{"s":"\u0000"}`)
		}
		for i, m := range b.Messages[:n] {
			if !r.poison(m) {
				continue
			}
			if i == 0 {
				// Alone, as the engine commits the run before a failure.
				_, err := r.uow.CommitFenced(ctx, position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
					Advance: map[string]int64{b.Source: m.GlobalPosition}}, unitofwork.Change{Effects: &abi.Effects{Writes: []abi.Write{{
					Kind: abi.RecordProjection, Type: "seen_" + b.Group, ID: "poison", Data: data}}}})
				return 0, err
			}
			n, ferr = i, nil
			break
		}
	}
	if n == 0 {
		return 0, ferr
	}
	var changes []unitofwork.Change
	for _, m := range b.Messages[:n] {
		// A new document per application (a second application does not
		// conflict with the first: the applied log shows it).
		data, _ := json.Marshal(map[string]any{"global_position": m.GlobalPosition})
		changes = append(changes, unitofwork.Change{Effects: &abi.Effects{Writes: []abi.Write{{
			Kind: abi.RecordProjection, Type: "seen_" + b.Group, ID: fmt.Sprintf("%d-%d", m.GlobalPosition, r.writes.Add(1)), ExpectedVersion: 0, Data: data}}}})
	}
	fence := position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: b.Messages[n-1].GlobalPosition}}
	if _, err := r.uow.CommitFenced(ctx, fence, changes...); err != nil {
		return 0, err
	}
	r.mu.Lock()
	for _, m := range b.Messages[:n] {
		r.applied[b.Group] = append(r.applied[b.Group], m.GlobalPosition)
	}
	r.mu.Unlock()
	return n, ferr
}

func (r *recorder) positions(group string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied[group])
}

// waitApplied waits until group has applied exactly want (in any order
// when sorted is false), and fails on a duplicate.
func (r *recorder) waitApplied(t *testing.T, group string, want []int64) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("group %s applies %d events", group, len(want)), func() (bool, string) {
		got := r.positions(group)
		return slices.Equal(got, want), fmt.Sprintf("applied %v, want %v", got, want)
	})
}

type consumerOpts struct {
	owner      string
	subs       []subscription.Subscription
	subsFn     func() []subscription.Subscription // if set, instead of subs
	ttl        time.Duration
	gapTimeout time.Duration
	retries    int
	keyWorkers int
	batch      int
	metrics    *subscription.Metrics
	classify   func(error) delivery.Class
	head       func(ctx context.Context, category string) (int64, error)
	now        func() time.Time
}

func (h *harness) consumer(t *testing.T, r *recorder, o consumerOpts) *subscription.Consumer {
	t.Helper()
	if o.owner == "" {
		o.owner = "host-a"
	}
	if o.subsFn == nil {
		o.subsFn = func() []subscription.Subscription { return o.subs }
	}
	if o.batch == 0 {
		o.batch = 7
	}
	if o.ttl == 0 {
		o.ttl = 2 * time.Second
	}
	c, err := subscription.NewConsumer(subscription.Options{
		Events: h.events, Positions: h.positions, Leases: h.leases, Failures: h.failures, Handler: r,
		Skip:          func(ctx context.Context, f position.Fence) error { _, err := h.uow.CommitFenced(ctx, f); return err },
		Subscriptions: o.subsFn,
		Key: func(field string, data json.RawMessage) string {
			if field == "" {
				field = "K" // the tests' default sequential_by field
			}
			var v map[string]any
			_ = json.Unmarshal(data, &v)
			if k, ok := v[field].(string); ok {
				return k
			}
			return ""
		},
		Owner: o.owner, LeaseTTL: o.ttl, Heartbeat: o.ttl / 5, Poll: 20 * time.Millisecond, BatchSize: o.batch,
		GapTimeout: o.gapTimeout, Retry: delivery.Policy{MaxRetries: o.retries, Delay: time.Millisecond}, KeyWorkers: o.keyWorkers, Metrics: o.metrics,
		Classify: o.classify, Head: o.head, Clock: clock.Funcs{NowFunc: o.now},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(t.Context()))
	t.Cleanup(func() { stop(t, c) })
	return c
}

func stop(t *testing.T, c *subscription.Consumer) {
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit())
	defer cancel()
	require.NoError(t, c.Stop(ctx))
}

// appendEvents appends n events to category cat, one stream per key k0..,
// data {"K": key, "I": i}, and returns their global positions.
func appendEvents(t *testing.T, s eventstore.Appender, cat string, keys []string, n int) []int64 {
	t.Helper()
	var out []int64
	for i := range n {
		k := keys[i%len(keys)]
		data, _ := json.Marshal(map[string]any{"K": k, "I": i})
		evs, err := s.Append(t.Context(), []eventstore.NewEvent{{Stream: cat + "-" + k, Type: "Happened", Data: data, ExpectedVersion: eventstore.AnyVersion}})
		require.NoError(t, err)
		out = append(out, evs[0].GlobalPosition)
	}
	return out
}
