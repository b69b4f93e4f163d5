package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// downEvents is an event store whose reads fail as a database that is
// down does.
type downEvents struct{ eventstore.Store }

var errDown = errors.New("failed to connect to `host=127.0.0.1`: dial error: connection refused")

func (downEvents) ReadStreamBytes(context.Context, string, int64, int, int) ([]eventstore.Event, error) {
	return nil, errDown
}

// A guest that fails because a host function's store call failed on the
// database passed the outage on: the failure is infrastructure, whatever
// kind the guest gave it, so it is retried without end and never charged
// to the message (it halted partitions on a PostgreSQL restart before).
// A guest's own failure stays the message's.
func TestGuestFailureAfterAStoreOutageIsInfrastructure(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	e.opts.Events = downEvents{mem.Events}

	done, err := e.Handler().Handle(ctx, opBatch(row.Generation, "read"))
	require.Equal(t, 0, done)
	var he *HandlerError
	require.ErrorAs(t, err, &he, "the guest's failure")
	require.ErrorIs(t, err, errDown, "keeps the store's error as its cause")
	require.Equal(t, delivery.Infrastructure, Classify(err))

	e.opts.Events = mem.Events
	_, err = e.Handler().Handle(ctx, opBatch(row.Generation, "transient"))
	require.Equal(t, delivery.Retry, Classify(err), "a guest's own transient failure")
	_, err = e.Handler().Handle(ctx, opBatch(row.Generation, "rejected"))
	require.Equal(t, delivery.Permanent, Classify(err), "a guest's own rejection")
}

// A call that fails as a whole (a trap) on a run of several messages is
// not charged to the run's first message: the handler reports the whole
// failure, committing nothing, and the delivery core runs the messages one
// at a time, so only the message that traps alone is given up, as the
// inline path does (TestInlineRunThatTrapsIsRedeliveredOneByOne).
func TestPartitionRunThatTrapsChargesOnlyTheGuilty(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	h := e.Handler()
	b := opBatch(row.Generation, "read", "stack", "read")

	done, err := h.Handle(ctx, b)
	require.Equal(t, 0, done)
	require.True(t, delivery.IsWhole(err), "the call failed as a whole: %v", err)
	require.Empty(t, seen(t, mem), "nothing committed")

	u := &batchUnit{h: h, b: b}
	core := &delivery.Core{Policy: delivery.Policy{MaxRetries: 0}, Classify: Classify}
	settled, err := core.Deliver(ctx, ctx, u, len(b.Messages))
	require.NoError(t, err)
	require.Equal(t, 3, settled)
	require.Equal(t, []int{1}, u.gaveUp, "only the trapping message is given up")
	require.Equal(t, []string{"1", "3"}, seen(t, mem))
}

// batchUnit hands a fixed batch to a partition handler as the delivery
// core's unit, recording what it gives up; the run goes on past it.
type batchUnit struct {
	h      delivery.Handler
	b      delivery.Batch
	gaveUp []int
}

func (u *batchUnit) Handle(ctx context.Context, from, to int) (int, error) {
	b := u.b
	b.Messages = b.Messages[from:to]
	return u.h.Handle(ctx, b)
}
func (u *batchUnit) Handled(context.Context, int, int) error  { return nil }
func (u *batchUnit) Resync(context.Context, int) (int, error) { return 0, nil }
func (u *batchUnit) Charge(context.Context, int) (int, error) { return 1, nil }
func (u *batchUnit) Attrs(int) []any                          { return nil }
func (u *batchUnit) GiveUp(_ context.Context, i, _ int, _ error) (bool, error) {
	u.gaveUp = append(u.gaveUp, i)
	return true, nil
}

// flakyEvents fails its first n stream reads as a database that is down.
type flakyEvents struct {
	eventstore.Store
	mu sync.Mutex
	n  int
}

func (f *flakyEvents) ReadStreamBytes(ctx context.Context, stream string, from int64, limit, maxBytes int) ([]eventstore.Event, error) {
	f.mu.Lock()
	down := f.n > 0
	f.n--
	f.mu.Unlock()
	if down {
		return nil, errDown
	}
	return f.Store.ReadStreamBytes(ctx, stream, from, limit, maxBytes)
}

// A broker consumer group retries an infrastructure failure in place,
// without a nack: with no retries allowed, a message whose handler's store
// read fails three times on the database is still handled once the
// database answers, and nothing is dead-lettered. (A nack counted it:
// dead-lettered at its first failure.)
func TestBrokerConsumerRetriesInfrastructureUncharged(t *testing.T) {
	e, mem := partitionEngine(t)
	e.opts.Events = &flakyEvents{Store: mem.Events, n: 3}
	src := startInline(t, e, broker.Options{MessageTimeout: time.Minute, EnableDLQ: true}, "read")
	testwait.For(t, "the message handled", func() (bool, string) {
		got := seen(t, mem)
		return len(got) == 1, fmt.Sprint(got)
	})
	dl, err := src.DLQ(context.Background(), "ops", "behave")
	require.NoError(t, err)
	require.Empty(t, dl)
}

// startInline starts broker groups delivering to e, one message per run,
// on a new inline broker with opts, holding one Op message of stream "ops"
// per op.
func startInline(t *testing.T, e *Engine, opts broker.Options, ops ...string) *broker.Inline {
	t.Helper()
	src, err := broker.NewInline(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	for _, m := range opBatch(1, ops...).Messages {
		m.Stream, m.Category = "ops", "ops"
		require.NoError(t, src.Publish(context.Background(), m))
	}
	startGroups(t, e, src, groups.Options{Batch: 1})
	return src
}

// A call that failed as a whole is the message's own failure unless the
// host's time ran it out: a stop, every instance busy, a timeout with at
// least half the deadline spent waiting on the stores or for an instance
// (before, the wait for an instance counted as the guest's: in make chaos
// a PostgreSQL stall held every instance, the next call got one late, ran
// out of time and halted its partition at the first attempt), or a store
// call that failed first.
func TestCallFailureTellsTheHostsTimeFromTheGuests(t *testing.T) {
	const limit = 4 * time.Second
	call := func(cause error, waited time.Duration) error {
		return &host.CallError{File: "m.wasm", Handler: "h", Err: cause, Waited: waited}
	}
	timeout := fmt.Errorf("%w (limit %s)", host.ErrTimeout, limit)
	for name, tc := range map[string]struct {
		err         error
		storeWait   time.Duration
		storeFailed error
		want        delivery.Class
	}{
		"a trap":                                   {err: call(host.ErrTrap, 0), want: delivery.Permanent},
		"a runaway guest":                          {err: call(timeout, 10*time.Millisecond), want: delivery.Permanent},
		"under half waiting":                       {err: call(timeout, time.Second), storeWait: 900 * time.Millisecond, want: delivery.Permanent},
		"half waiting on the stores":               {err: call(timeout, 0), storeWait: 2 * time.Second, want: delivery.Infrastructure},
		"half waiting for an instance":             {err: call(timeout, 2*time.Second), want: delivery.Infrastructure},
		"waiting for an instance and on the store": {err: call(timeout, time.Second), storeWait: time.Second, want: delivery.Infrastructure},
		"every instance busy":                      {err: call(host.ErrNoInstance, limit), want: delivery.Infrastructure},
		"code still compiling, not waited on":      {err: call(fmt.Errorf("%w (%w)", host.ErrNotReady, host.ErrTimeout), 0), want: delivery.Infrastructure},
		"a stop":                                   {err: call(host.ErrCanceled, 0), want: delivery.Infrastructure},
		"no slot of the tenant's share":            {err: call(&host.QueueError{Tenant: "shop", Waited: "a guest slot", Err: context.DeadlineExceeded}, limit), want: delivery.Infrastructure},
		"after a store call failed":                {err: call(timeout, 0), storeFailed: errDown, want: delivery.Infrastructure},
	} {
		t.Run(name, func(t *testing.T) {
			kind, err := callFailure(tc.err, tc.storeWait, tc.storeFailed, limit)
			herr := &HandlerError{File: "m.wasm", Handler: "h", Type: "T", Kind: kind, Err: err}
			require.Equal(t, tc.want, Classify(herr))
			require.ErrorIs(t, herr, tc.err.(*host.CallError).Err, "the cause survives")
		})
	}
}
