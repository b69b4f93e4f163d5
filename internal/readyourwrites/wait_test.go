package readyourwrites

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A consumer's marks fold into the watermark as they pile up; a gap (an
// event never handled) stops the fold there, and then the walks thin out
// (not one per event) until the gap is handled.
func TestMarksCompact(t *testing.T) {
	events := eventstore.NewMemory(nil)
	ctx := context.Background()
	var evs []eventstore.NewEvent
	for i := range 3 * compactAt {
		evs = append(evs, eventstore.NewEvent{Stream: fmt.Sprintf("c-%d", i), Type: "E", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion})
	}
	stored, err := events.Append(ctx, evs)
	require.NoError(t, err)
	w := New(Options{Events: events})
	r := Route{Group: "g", Category: "c"}
	mark := func(gp int64) {
		if w.Mark(r, gp, "") {
			w.Fold(ctx, r, gp, nil)
		}
	}
	for _, ev := range stored[:compactAt] {
		mark(ev.GlobalPosition)
	}
	require.Equal(t, stored[compactAt-1].GlobalPosition, w.marks.watermark("g", "c"), "folded")
	require.Empty(t, w.marks.groups["g"]["c"].above)

	gap := stored[compactAt+10].GlobalPosition
	for _, ev := range stored[compactAt:] {
		if ev.GlobalPosition != gap {
			mark(ev.GlobalPosition)
		}
	}
	require.Equal(t, gap-1, w.marks.watermark("g", "c"), "folded up to the gap")
	h := w.marks.groups["g"]["c"]
	require.Len(t, h.above, int(stored[len(stored)-1].GlobalPosition-gap), "the marks above the gap are kept")
	require.Greater(t, h.walkAt, len(h.above), "the next walk waits for more than are kept")

	mark(gap)
	ok, err := w.caughtUp(ctx, Target{Route: r}, stored[len(stored)-1].GlobalPosition, &pass{})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, stored[len(stored)-1].GlobalPosition, w.marks.watermark("g", "c"))
	require.Empty(t, h.above)
}

// unitSource is a partition-like source that counts its reads: the key's
// unit has committed up to at from the read after the first after ones on
// (0 before); remote says other hosts advance it.
type unitSource struct {
	at        int64
	after     int
	remote    bool
	positions int
}

func (s *unitSource) Check(string, int64) Check { return s }
func (s *unitSource) Remote() bool              { return s.remote }

func (s *unitSource) Handled(context.Context, Route, eventstore.Event) (bool, error) {
	return false, nil
}

func (s *unitSource) KeyPosition(context.Context, Route, string) (int64, bool, error) {
	s.positions++
	if s.positions > s.after {
		return s.at, true, nil
	}
	return 0, true, nil
}

// A keyed wait whose key this process handled in key order up to the
// position waited for, or past it, is done without a read of the source
// or the store: the usual read of one's own write on the host whose
// partition worker ran it. A mark without the key (a broker group's, in
// order per stream only), or another key's, does not count: the wait
// reads as before.
func TestKeyedWaitDoneByInOrderMarks(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	var evs []eventstore.NewEvent
	for i := range 6 {
		evs = append(evs, eventstore.NewEvent{Stream: fmt.Sprintf("c-%d", i), Type: "E",
			Data: json.RawMessage(fmt.Sprintf(`{"id":"k%d"}`, i%2)), ExpectedVersion: eventstore.AnyVersion})
	}
	stored, err := mem.Append(ctx, evs)
	require.NoError(t, err)
	n := stored[4].GlobalPosition // k0's third event
	r := Route{Group: "g", Category: "c", Field: "id"}
	wait := func(w *Waiter, src *unitSource) error {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		return w.Wait(short, "g", n, "id", "k0", func() ([]Target, error) {
			return []Target{{Route: r, Source: src}}, nil
		})
	}

	counted := &forwardOnly{Events: mem}
	store := &backward{forwardOnly: counted, br: mem} // counts the reads both ways
	reads := func() int { return counted.reads + store.reads }
	w := New(Options{Events: store, KeyOf: keyOf})
	src := &unitSource{}
	w.Mark(r, stored[5].GlobalPosition, "k1") // another key's
	w.Mark(r, stored[2].GlobalPosition, "")   // an earlier k0 event, with no key
	require.ErrorIs(t, wait(w, src), ErrNotCaughtUp, "k0's event at n is not handled")
	require.Positive(t, src.positions+reads(), "the wait read")

	src.positions, counted.reads, store.reads = 0, 0, 0
	w.Mark(r, n, "k0")
	require.NoError(t, wait(w, src))
	require.Zero(t, src.positions, "no read of the unit's position")
	require.Zero(t, reads(), "no read of the store")

	w2 := New(Options{Events: store, KeyOf: keyOf})
	w2.Mark(r, stored[4].GlobalPosition+100, "k0") // past n: every k0 event up to it is handled
	require.NoError(t, wait(w2, src))
	require.Zero(t, src.positions+reads())
}

// A wait for a projection another host runs re-checks after 5 ms, then
// twice as late each time up to every 50 ms: the usual projection, done
// within a few milliseconds there, is read without waiting out a fixed
// 50 ms poll.
func TestRemoteWaitPollsSoonThenBacksOff(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	stored, err := mem.Append(ctx, []eventstore.NewEvent{{Stream: "c-1", Type: "E", Data: json.RawMessage(`{"id":"k"}`), ExpectedVersion: eventstore.AnyVersion}})
	require.NoError(t, err)
	n := stored[0].GlobalPosition
	var waits []time.Duration
	w := New(Options{Events: mem, KeyOf: keyOf, After: func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		ch := make(chan time.Time, 1)
		ch <- time.Time{}
		return ch
	}})
	src := &unitSource{after: 6, at: n, remote: true}
	r := Route{Group: "g", Category: "c", Field: "id"}
	require.NoError(t, w.Wait(ctx, "g", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r, Source: src}}, nil }))
	ms := time.Millisecond
	require.Equal(t, []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 50 * ms, 50 * ms}, waits)
}

// localSource is a unitSource whose key's unit also runs in this process
// (LocalCheck): it answers local, with no read, while owned.
type localSource struct {
	unitSource
	local int64
	owned bool
	asked int
}

func (s *localSource) Check(string, int64) Check { return s }

func (s *localSource) LocalKeyPosition(Route, string) (int64, bool) {
	s.asked++
	return s.local, s.owned
}

// A read of one's own write whose key's unit runs in this process reads
// nothing: the unit's position is the worker's own (LocalCheck), the
// key's last event at or below n is the reader's own, just appended here
// (Appended), and the wait wakes on the unit's mark. It asks for no quick
// remote poll, only the safety net's.
func TestKeyedWaitOnALocalUnitReadsNothing(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	stored, err := mem.Append(ctx, []eventstore.NewEvent{
		{Stream: "c-1", Type: "E", Data: json.RawMessage(`{"id":"k0"}`), ExpectedVersion: eventstore.AnyVersion},
		{Stream: "c-2", Type: "E", Data: json.RawMessage(`{"id":"k1"}`), ExpectedVersion: eventstore.AnyVersion},
	})
	require.NoError(t, err)
	n := stored[1].GlobalPosition
	counted := &forwardOnly{Events: mem}
	store := &backward{forwardOnly: counted, br: mem}
	polls := make(chan time.Duration, 8)
	w := New(Options{Events: store, KeyOf: keyOf, After: func(d time.Duration) <-chan time.Time {
		polls <- d // the wait is about to sleep
		return nil // never due: only the mark wakes the wait
	}})
	w.Appended(stored)
	src := &localSource{unitSource: unitSource{remote: true}, local: stored[0].GlobalPosition, owned: true}
	r := Route{Group: "g", Category: "c", Field: "id"}
	waited := make(chan error, 1)
	go func() {
		waited <- w.Wait(ctx, "g", n, "id", "k1", func() ([]Target, error) { return []Target{{Route: r, Source: src}}, nil })
	}()
	require.Equal(t, remotePoll, testwait.Recv(t, "the wait going to sleep", polls), "the safety net's poll, not the quick remote one")
	w.Mark(r, n, "k1")
	require.NoError(t, testwait.Recv(t, "the wait's end", waited))
	require.Empty(t, polls, "the mark ended the wait")
	require.Zero(t, src.positions, "no read of the unit's position")
	require.Zero(t, counted.reads+store.reads, "no read of the store")
	require.Positive(t, src.asked)
}

// A local answer is a lower bound: when the unit was lost to another
// process, its worker's position lags, and the wait's safety-net poll
// asks the source, whose answer ends it. A unit this process does not run
// is asked of the source at once.
func TestALocalAnswerIsCheckedAtThePoll(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	stored, err := mem.Append(ctx, []eventstore.NewEvent{{Stream: "c-1", Type: "E", Data: json.RawMessage(`{"id":"k"}`), ExpectedVersion: eventstore.AnyVersion}})
	require.NoError(t, err)
	n := stored[0].GlobalPosition
	var polls []time.Duration
	w := New(Options{Events: mem, KeyOf: keyOf, After: func(d time.Duration) <-chan time.Time {
		polls = append(polls, d)
		ch := make(chan time.Time, 1)
		ch <- time.Time{}
		return ch
	}})
	r := Route{Group: "g", Category: "c", Field: "id"}
	src := &localSource{unitSource: unitSource{at: n, remote: true}, local: 0, owned: true}
	require.NoError(t, w.Wait(ctx, "g", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r, Source: src}}, nil }))
	require.Equal(t, 2, src.asked, "each check asked the local unit")
	require.Equal(t, 1, src.positions, "the poll read the source")
	require.Equal(t, []time.Duration{remotePoll}, polls)

	// While the process hears the others' commits, a lost unit's new
	// owner's are heard: the safety net polls less often, and still reads.
	w.Hearing(true)
	polls = nil
	heard := &localSource{unitSource: unitSource{after: 1, at: n, remote: true}, local: 0, owned: true}
	rh := Route{Group: "gh", Category: "c", Field: "id"}
	require.NoError(t, w.Wait(ctx, "gh", n, "id", "k", func() ([]Target, error) { return []Target{{Route: rh, Source: heard}}, nil }))
	require.Equal(t, 2, heard.positions, "each poll read the source")
	require.Equal(t, []time.Duration{heardPoll, heardPoll}, polls, "a poll that did not end the wait paces as local too")

	notHere := &localSource{unitSource: unitSource{at: n, remote: true}}
	require.NoError(t, New(Options{Events: mem, KeyOf: keyOf}).Wait(ctx, "g", n, "id", "k", func() ([]Target, error) {
		return []Target{{Route: r, Source: notHere}}, nil
	}))
	require.Equal(t, 1, notHere.positions, "a unit not run here is read at the first check")
}

// Appended remembers the events by position and category only: the
// search for the key's last event reads the store when the event at n
// is another key's, another category's, or no longer held.
func TestRecentAppendsAnswerOnlyTheirOwnKeyAtN(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	var evs []eventstore.NewEvent
	for i := range 3 {
		evs = append(evs, keyedEvent(false, i%2, i))
	}
	stored, err := mem.Append(ctx, evs)
	require.NoError(t, err)
	counted := &forwardOnly{Events: mem}
	store := &backward{forwardOnly: counted, br: mem}
	w := New(Options{Events: store, KeyOf: keyOf})
	w.Appended(stored)
	last := func(category, key string, n int64) int64 {
		t.Helper()
		got, err := w.lastOfKey(ctx, category, 0, n, &pass{field: "id", key: key})
		require.NoError(t, err)
		return got
	}
	n := stored[2].GlobalPosition // k0's
	require.Equal(t, n, last("c", "k0", n))
	require.Zero(t, store.reads, "the key's own event at n: no read")
	require.Equal(t, stored[1].GlobalPosition, last("c", "k1", n), "another key's event at n: the search reads")
	require.Equal(t, 1, store.reads)
	require.Zero(t, last("o", "k0", n), "another category: the search reads, and finds none")
	require.Equal(t, 2, store.reads)

	for i := int64(1); i <= recentSlots; i++ { // n's slot is taken by a later event
		w.Appended([]eventstore.Event{{Stream: "o-1", GlobalPosition: n + i, Data: json.RawMessage(`{"id":"k0"}`)}})
	}
	require.Equal(t, n, last("c", "k0", n))
	require.Equal(t, 3, store.reads, "no longer held: the search reads")
}

// A keyed wait on a unit another process runs wakes when that process's
// commit of the key's event is announced (HandledElsewhere), not at its
// next poll, and is done with no further read of the unit's position. An
// announcement of another key, or below the event waited for, does not
// end it; one that comes before the wait spares its first read too.
func TestKeyedWaitWakesOnAnAdvanceElsewhere(t *testing.T) {
	ctx := context.Background()
	mem := eventstore.NewMemory(nil)
	stored, err := mem.Append(ctx, []eventstore.NewEvent{
		{Stream: "c-1", Type: "E", Data: json.RawMessage(`{"id":"k"}`), ExpectedVersion: eventstore.AnyVersion},
		{Stream: "c-2", Type: "E", Data: json.RawMessage(`{"id":"k"}`), ExpectedVersion: eventstore.AnyVersion},
	})
	require.NoError(t, err)
	n := stored[1].GlobalPosition
	polls := make(chan time.Duration, 8)
	w := New(Options{Events: mem, KeyOf: keyOf, After: func(d time.Duration) <-chan time.Time {
		polls <- d // the wait is about to sleep
		return nil // never due: only an announcement wakes the wait
	}})
	w.Appended(stored)
	src := &unitSource{remote: true} // the unit has committed nothing yet
	r := Route{Group: "g", Category: "c", Field: "id"}
	waited := make(chan error, 1)
	go func() {
		waited <- w.Wait(ctx, "g", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r, Source: src}}, nil })
	}()
	require.Equal(t, firstRemotePoll, testwait.Recv(t, "the wait going to sleep", polls))
	require.Equal(t, 1, src.positions, "the first check read the unit's position")
	w.HandledElsewhere(r, n, "other")                             // another key's
	w.HandledElsewhere(r, n-1, "k")                               // below the key's event at n
	w.HandledElsewhere(Route{Group: "g2", Category: "c"}, n, "k") // another group's
	select {
	case err := <-waited:
		t.Fatalf("the wait ended on an announcement that does not cover it: %v", err)
	default:
	}
	w.HandledElsewhere(r, n, "k")
	require.NoError(t, testwait.Recv(t, "the wait's end", waited))
	require.Equal(t, 1, src.positions, "no read after the announcement")

	// Announced before the wait: no read at all.
	before := &unitSource{remote: true}
	w.HandledElsewhere(Route{Group: "g", Category: "c"}, n+5, "k2")
	require.NoError(t, w.Wait(ctx, "g", n, "id", "k2", func() ([]Target, error) { return []Target{{Route: r, Source: before}}, nil }))
	require.Zero(t, before.positions)

	// While the announcements are heard, a keyed wait relies on them and
	// reads the unit's position at the safety net's poll only; a wait that
	// is not keyed by the unit's field polls as quickly as before.
	w.Hearing(true)
	keyed := &unitSource{remote: true}
	r3 := Route{Group: "g3", Category: "c", Field: "id"}
	go func() {
		waited <- w.Wait(ctx, "g3", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r3, Source: keyed}}, nil })
	}()
	require.Equal(t, remotePoll, testwait.Recv(t, "the keyed wait going to sleep", polls), "the safety net's poll")
	w.HandledElsewhere(r3, n, "k")
	require.NoError(t, testwait.Recv(t, "the keyed wait's end", waited))
	require.Equal(t, 1, keyed.positions)
	// A unit source that can tell its units run here (LocalCheck) is not
	// read at all for a unit another process runs: the announcement ends
	// the wait.
	elsewhere := &localSource{unitSource: unitSource{remote: true}}
	r5 := Route{Group: "g5", Category: "c", Field: "id"}
	go func() {
		waited <- w.Wait(ctx, "g5", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r5, Source: elsewhere}}, nil })
	}()
	require.Equal(t, remotePoll, testwait.Recv(t, "the wait on a unit elsewhere going to sleep", polls))
	w.HandledElsewhere(r5, n, "k")
	require.NoError(t, testwait.Recv(t, "the wait on a unit elsewhere's end", waited))
	require.Zero(t, elsewhere.positions, "no read of the unit's position")
	require.Positive(t, elsewhere.asked)
	other := Route{Group: "g4", Category: "c", Field: "other"}
	octx, cancel := context.WithCancel(ctx)
	go func() {
		waited <- w.Wait(octx, "g4", n, "id", "k", func() ([]Target, error) { return []Target{{Route: other, Source: &unitSource{remote: true}}}, nil })
	}()
	require.Equal(t, firstRemotePoll, testwait.Recv(t, "the wait on another field going to sleep", polls), "the quick poll")
	cancel()
	require.ErrorIs(t, testwait.Recv(t, "the canceled wait's end", waited), context.Canceled)
	// A process manager's unit (correlated) is not announced by its wait's
	// key: it is read at once and polled quickly.
	correlated := &localSource{unitSource: unitSource{remote: true}}
	r6 := Route{Group: "g6", Category: "c", Field: "id", Correlated: true}
	octx, cancel = context.WithCancel(ctx)
	go func() {
		waited <- w.Wait(octx, "g6", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r6, Source: correlated}}, nil })
	}()
	require.Equal(t, firstRemotePoll, testwait.Recv(t, "the correlated wait going to sleep", polls), "the quick poll")
	require.Equal(t, 1, correlated.positions, "the unit's position read at once")
	cancel()
	require.ErrorIs(t, testwait.Recv(t, "the canceled wait's end", waited), context.Canceled)

	// When every advance is told as its key's (no priority lanes), a keyed
	// wait on another process's unit polls at the slow safety pace.
	w.HearsEveryAdvance(true)
	every := &localSource{unitSource: unitSource{remote: true}}
	r7 := Route{Group: "g7", Category: "c", Field: "id"}
	go func() {
		waited <- w.Wait(ctx, "g7", n, "id", "k", func() ([]Target, error) { return []Target{{Route: r7, Source: every}}, nil })
	}()
	require.Equal(t, heardPoll, testwait.Recv(t, "the wait on a unit elsewhere going to sleep", polls), "the slow safety poll")
	// Losing the hearing wakes it: it reads the unit's position at once
	// and polls quickly, as a wait that does not hear.
	w.Hearing(false)
	require.Equal(t, firstRemotePoll, testwait.Recv(t, "the wait going to sleep again, not hearing", polls), "the quick poll")
	require.Equal(t, 1, every.positions, "read once hearing was lost")
	w.HandledElsewhere(r7, n, "k")
	require.NoError(t, testwait.Recv(t, "the wait's end", waited))
	w.HearsEveryAdvance(false)
}
