package subscription_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/subscription"
)

// slowList is Failures whose List costs a second of the consumer's clock,
// as listing tens of thousands of held records does (86,400 held records,
// a key halted for a day at one event a second, list in ~200 ms on
// PostgreSQL), and counts its calls.
type slowList struct {
	subscription.Failures
	clock *atomic.Int64 // nanoseconds past base
	lists atomic.Int64
}

func (s *slowList) List(ctx context.Context, group, unit string, open bool) ([]subscription.Failure, error) {
	s.lists.Add(1)
	s.clock.Add(int64(time.Second))
	return s.Failures.List(ctx, group, unit, open)
}

// Reading the open failure records is paced by what it costs: a list
// that takes a second is not run again every poll (it was: the worker
// spent most of its time listing held records, and a key halted for a day
// slowed every other key of the category by as much), but at most a tenth
// of the time.
func TestReplayListIsPacedByItsCost(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	var clock atomic.Int64
	base := time.Now()
	now := func() time.Time { return base.Add(time.Duration(clock.Load())) }
	slow := &slowList{Failures: h.failures, clock: &clock}
	h.failures = slow
	pos := appendEvents(t, h.events, "order", []string{"a", "b"}, 40)
	r := newRecorder(h.uow)
	h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "proj", Category: "order"}}, batch: 5, now: now})
	r.waitApplied(t, "proj", pos) // 8 batches: 8 passes of the worker's loop at least
	require.Equal(t, int64(1), slow.lists.Load(), "one list in the first 10 s of the consumer's clock, which only lists move")
}
