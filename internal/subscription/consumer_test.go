package subscription_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMemorySubscription(t *testing.T) {
	t.Parallel()
	runSuite(t, memoryHarness)
}

func TestPostgresSubscription(t *testing.T) {
	t.Parallel()
	runSuite(t, postgresHarness)
}

func runSuite(t *testing.T, newHarness func(t *testing.T) *harness) {
	for name, fn := range map[string]func(t *testing.T, h *harness){
		"ResumesAfterItsPositionExactlyOnce":      testResumes,
		"OneOwnerAcrossHosts":                     testOneOwner,
		"FailedMessageRecordedSkippedRetried":     testFailedUnpartitioned,
		"FailedKeyHoldsItsLaterMessages":          testFailedKeyHalts,
		"LeaseLapsesAfterTTL":                     testLeaseLapse,
		"FollowsTheSubscriptionList":              testFollowsList,
		"KeyWorkersKeepKeyOrderAndResumeMidBatch": testKeyWorkers,
		"FencedOwnerParksNothing":                 testFencedOwnerParksNothing,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newHarness(t))
		})
	}
}

func concat(a ...[]int64) []int64 { return slices.Concat(a...) }

func testResumes(t *testing.T, h *harness) {
	subs := []subscription.Subscription{{Group: "byorder", Category: "order"}, {Group: "everything", Category: subscription.All}}
	other := appendEvents(t, h.events, "payment", []string{"p"}, 3)
	first := appendEvents(t, h.events, "order", []string{"a", "b"}, 20)
	r := newRecorder(h.uow)
	c := h.consumer(t, r, consumerOpts{subs: subs})
	r.waitApplied(t, "byorder", first)
	r.waitApplied(t, "everything", concat(other, first))
	stop(t, c)

	// Stopped: events appended now are handled by the next owner, after
	// the position, and nothing before it again.
	second := appendEvents(t, h.events, "order", []string{"a", "c"}, 9)
	r2 := newRecorder(h.uow)
	h.consumer(t, r2, consumerOpts{subs: subs, owner: "host-b"})
	r2.waitApplied(t, "byorder", second)
	r2.waitApplied(t, "everything", second)
	row, ok, err := h.positions.Get(t.Context(), "byorder", "order")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(2), row.Generation, "the second owner claimed the unit")
	require.Equal(t, second[len(second)-1], row.Positions["order"])
}

func testOneOwner(t *testing.T, h *harness) {
	subs := []subscription.Subscription{{Group: "proj", Category: "order"}}
	r := newRecorder(h.uow) // both hosts commit through it: a duplicate would show
	// host-a must keep its lease while host-b starts (a stop releases it,
	// so the takeover waits on no TTL): a TTL a busy machine's stall
	// cannot outlast.
	const ttl = 5 * time.Second
	a := h.consumer(t, r, consumerOpts{subs: subs, owner: "host-a", ttl: ttl})
	first := appendEvents(t, h.events, "order", []string{"a"}, 10)
	r.waitApplied(t, "proj", first)
	h.consumer(t, r, consumerOpts{subs: subs, owner: "host-b", ttl: ttl})
	owner, _, ok, err := h.leases.Holder(t.Context(), "proj", "order")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "host-a", owner)
	stop(t, a) // releases: host-b takes over on its next pass
	second := appendEvents(t, h.events, "order", []string{"b"}, 10)
	r.waitApplied(t, "proj", concat(first, second))
	testwait.For(t, "host-b holds the lease", func() (bool, string) {
		owner, _, _, err := h.leases.Holder(t.Context(), "proj", "order")
		return err == nil && owner == "host-b", owner
	})
}

func testFailedUnpartitioned(t *testing.T, h *harness) {
	subs := []subscription.Subscription{{Group: "proj", Category: "order"}}
	pos := appendEvents(t, h.events, "order", []string{"a", "b"}, 8)
	bad := pos[3]
	r := newRecorder(h.uow)
	r.setFail(func(_ string, m delivery.Message) error {
		if m.GlobalPosition == bad {
			return msgErr{retryable: true}
		}
		return nil
	})
	metrics := subscription.NewMetrics(nil)
	h.consumer(t, r, consumerOpts{subs: subs, retries: 2, metrics: metrics})
	without := slices.DeleteFunc(slices.Clone(pos), func(p int64) bool { return p == bad })
	r.waitApplied(t, "proj", without)
	fs, err := h.failures.List(t.Context(), "proj", "", false)
	require.NoError(t, err)
	require.Len(t, fs, 1)
	require.Equal(t, subscription.StatusFailed, fs[0].Status)
	require.Equal(t, bad, fs[0].GlobalPosition)
	require.Equal(t, 3, fs[0].Attempts, "the first attempt and max_retries = 2 retries")
	row, _, err := h.positions.Get(t.Context(), "proj", "order")
	require.NoError(t, err)
	require.Equal(t, pos[len(pos)-1], row.Positions["order"], "the position went on past the recorded message")

	require.ErrorIs(t, h.failures.Mark(t.Context(), "proj", "order", bad, subscription.ActionSkip+"x"), subscription.ErrInvalid)
	r.setFail(nil)
	require.NoError(t, h.failures.Mark(t.Context(), "proj", "order", bad, subscription.ActionRetry))
	r.waitApplied(t, "proj", append(without, bad))
	testwait.For(t, "the record is resolved", func() (bool, string) {
		fs, err := h.failures.List(t.Context(), "proj", "order", false)
		if err != nil || len(fs) != 1 {
			return false, "list failed"
		}
		return fs[0].Status == subscription.StatusResolved, string(fs[0].Status)
	})
	require.ErrorIs(t, h.failures.Mark(t.Context(), "proj", "order", bad, subscription.ActionRetry), subscription.ErrStatus)
	require.Empty(t, retrySources(t, h), "the rerun's source left the row with its resolved record")
}

func testFailedKeyHalts(t *testing.T, h *harness) {
	subs := []subscription.Subscription{{Group: "proj", Category: "order", Partitioned: true}}
	pos := appendEvents(t, h.events, "order", []string{"a", "b"}, 10) // a at even indexes
	bad := pos[2]                                                     // a's second
	r := newRecorder(h.uow)
	r.setFail(func(_ string, m delivery.Message) error {
		if m.GlobalPosition == bad {
			return msgErr{retryable: false}
		}
		return nil
	})
	h.consumer(t, r, consumerOpts{subs: subs, retries: 5})
	var flowing, held []int64
	for i, p := range pos {
		switch {
		case i%2 == 1 || i < 2:
			flowing = append(flowing, p)
		case p != bad:
			held = append(held, p)
		}
	}
	r.waitApplied(t, "proj", flowing)
	fs, err := h.failures.List(t.Context(), "proj", "order", true)
	require.NoError(t, err)
	var got []int64
	for _, f := range fs {
		got = append(got, f.GlobalPosition)
		require.Equal(t, "a", f.Key)
	}
	require.Equal(t, append([]int64{bad}, held...), got)
	require.Equal(t, subscription.StatusFailed, fs[0].Status)
	require.Equal(t, 1, fs[0].Attempts, "a permanent failure is not retried")
	for _, f := range fs[1:] {
		require.Equal(t, subscription.StatusHeld, f.Status)
	}
	// A new message of the halted key is held too; b still flows.
	more := appendEvents(t, h.events, "order", []string{"a", "b"}, 2)
	r.waitApplied(t, "proj", append(flowing, more[1]))
	// Skipping the head releases the key: its held messages run in order.
	require.NoError(t, h.failures.Mark(t.Context(), "proj", "order", bad, subscription.ActionSkip))
	r.waitApplied(t, "proj", concat(flowing, []int64{more[1]}, held, more[:1]))
	testwait.For(t, "no open records", func() (bool, string) {
		fs, err := h.failures.List(t.Context(), "proj", "order", true)
		return err == nil && len(fs) == 0, "open records left"
	})
	require.Empty(t, retrySources(t, h), "each rerun's source left the row with its resolved record")
}

// retrySources lists the rerun sources (subscription.RetrySource) left in
// proj/order's positions row.
func retrySources(t *testing.T, h *harness) []string {
	t.Helper()
	row, _, err := h.positions.Get(t.Context(), "proj", "order")
	require.NoError(t, err)
	var out []string
	for src := range row.Positions {
		if strings.HasPrefix(src, "retry:") {
			out = append(out, src)
		}
	}
	return out
}

func testLeaseLapse(t *testing.T, h *harness) {
	ctx := t.Context()
	// Long enough that the next two calls come within it on a busy
	// machine (at 300 ms a stalled test could see b take a live lease);
	// the lapse after them is waited for.
	ok, err := h.leases.Acquire(ctx, "g", "order", "a", 2*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = h.leases.Acquire(ctx, "g", "order", "b", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "a live lease is not taken")
	ok, err = h.leases.Renew(ctx, "g", "order", "b", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "only the owner renews")
	testwait.True(t, "b takes the lapsed lease", func() bool {
		ok, err := h.leases.Acquire(ctx, "g", "order", "b", time.Minute)
		return err == nil && ok
	})
	ok, err = h.leases.Renew(ctx, "g", "order", "a", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "the old owner's renewal fails once another took it")
}

// A reload changes the list: the worker of a removed subscription stops
// and releases its lease, a new one starts at the beginning of its
// category.
func testFollowsList(t *testing.T, h *harness) {
	var list atomic.Pointer[[]subscription.Subscription]
	list.Store(&[]subscription.Subscription{{Group: "old", Category: "order"}})
	pos := appendEvents(t, h.events, "order", []string{"a"}, 5)
	r := newRecorder(h.uow)
	h.consumer(t, r, consumerOpts{subsFn: func() []subscription.Subscription { return *list.Load() }, ttl: time.Minute})
	r.waitApplied(t, "old", pos)
	list.Store(&[]subscription.Subscription{{Group: "new", Category: "order"}})
	r.waitApplied(t, "new", pos)
	testwait.For(t, "the removed subscription's lease released", func() (bool, string) {
		owner, _, ok, err := h.leases.Holder(t.Context(), "old", "order")
		return err == nil && !ok, owner
	})
	more := appendEvents(t, h.events, "order", []string{"b"}, 2)
	r.waitApplied(t, "new", concat(pos, more))
	require.Equal(t, pos, r.positions("old"), "the removed subscription handles nothing more")
}

// Per-key workers: each key's events commit in order; a stop in the middle
// of a batch (one slot failing, the others committed) and a restart with
// another slot count apply every event exactly once.
func testKeyWorkers(t *testing.T, h *harness) {
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	pos := appendEvents(t, h.events, "order", keys, 30)
	keyOf := map[int64]string{}
	for i, p := range pos {
		keyOf[p] = keys[i%len(keys)]
	}
	// The failing key shares its slot with an earlier key, so the slot
	// commits a prefix before it sticks (a restart must not re-apply it).
	bad := ""
	for j := 1; j < len(keys) && bad == ""; j++ {
		for i := range j {
			if subscription.Slot(keys[i], 3) == subscription.Slot(keys[j], 3) {
				bad = keys[j]
				break
			}
		}
	}
	require.NotEmpty(t, bad, "6 keys in 3 slots: two share one")
	subs := []subscription.Subscription{{Group: "proj", Category: "order", Partitioned: true}}
	r := newRecorder(h.uow)
	r.setFail(func(_ string, m delivery.Message) error {
		if keyOf[m.GlobalPosition] == bad {
			return errors.New("database down") // not the message's failure: retried without end
		}
		return nil
	})
	c := h.consumer(t, r, consumerOpts{subs: subs, keyWorkers: 3, batch: 50})
	// One batch: every other slot commits all its events; the failing
	// key's slot commits what precedes the key's first event.
	stuck, first, want := subscription.Slot(bad, 3), slices.Index(keys, bad), 0
	for i := range pos {
		k := keys[i%len(keys)]
		if subscription.Slot(k, 3) != stuck || i < first {
			want++
		}
	}
	testwait.For(t, "the slots other than the failing key's applied", func() (bool, string) {
		n := len(r.positions("proj"))
		return n == want, fmt.Sprint(n, " want ", want)
	})
	stop(t, c)
	row, _, err := h.positions.Get(t.Context(), "proj", "order")
	require.NoError(t, err)
	require.Zero(t, row.Positions["order"], "no low-water mark past the failing key's uncommitted events: %v", row.Positions)

	r.setFail(nil)
	h.consumer(t, r, consumerOpts{subs: subs, keyWorkers: 2, owner: "host-b"})
	testwait.For(t, "all 30 applied once", func() (bool, string) {
		n := len(r.positions("proj"))
		return n == 30, fmt.Sprint(n)
	})
	got := r.positions("proj")
	require.ElementsMatch(t, pos, got, "each event applied exactly once")
	for _, k := range keys {
		var want, have []int64
		for _, p := range pos {
			if keyOf[p] == k {
				want = append(want, p)
			}
		}
		for _, p := range got {
			if keyOf[p] == k {
				have = append(have, p)
			}
		}
		require.Equal(t, want, have, "key %s in order", k)
	}
	more := appendEvents(t, h.events, "order", keys, 12)
	testwait.For(t, "later events applied under the new slot count", func() (bool, string) {
		n := len(r.positions("proj"))
		return n == 42, fmt.Sprint(n)
	})
	row, _, err = h.positions.Get(t.Context(), "proj", "order")
	require.NoError(t, err)
	testwait.For(t, "the low-water mark at the last event", func() (bool, string) {
		row, _, err = h.positions.Get(t.Context(), "proj", "order")
		return err == nil && row.Positions["order"] == more[len(more)-1], fmt.Sprint(row.Positions)
	})
}
