// Package storetest is the conformance suite for eventstore.Store
// implementations. Every implementation (memory, PostgreSQL) runs it from a
// test of its own:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness { ... })
//	}
//
// The suite uses only the interfaces below, so it pins what callers may rely
// on and nothing an implementation happens to do besides.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/suite"
)

// Tx is a transaction on the store under test, as the suite drives it. The
// memory store's *eventstore.MemoryTx fits after a thin adapter; a
// PostgreSQL store wraps its pgx.Tx.
type Tx interface {
	eventstore.Appender
	// StreamVersion and ReadStream see the transaction's own appends.
	StreamVersion(ctx context.Context, stream string) (int64, error)
	ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]eventstore.Event, error)
	suite.Tx
}

// Harness is one store under test.
type Harness = suite.Harness[eventstore.Store, Tx]

// Run runs the suite. newHarness is called once per subtest, possibly from
// parallel subtests.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	suite.Run(t, map[string]func(t *testing.T, h Harness){
		"AppendAndRead":                 testAppendAndRead,
		"EmptyAppend":                   testEmptyAppend,
		"CallerIDs":                     testCallerIDs,
		"PositionsGapless":              testPositionsGapless,
		"InclusiveReads":                testInclusiveReads,
		"Limits":                        testLimits,
		"DefaultLimit":                  testDefaultLimit,
		"ByteBoundedReads":              testByteBoundedReads,
		"CategoryIsolation":             testCategoryIsolation,
		"CategoryBackward":              testCategoryBackward,
		"InvalidInput":                  testInvalidInput,
		"CancelledContext":              testCancelledContext,
		"ExpectedVersion":               testExpectedVersion,
		"ExpectedVersionWithinBatch":    testExpectedVersionWithinBatch,
		"BatchAtomicity":                testBatchAtomicity,
		"ConcurrentWritersOneWins":      testConcurrentWritersOneWins,
		"ConcurrentWritersNoLostAppend": testConcurrentWritersNoLostAppend,
		"TxStagedNotVisibleUntilCommit": testTxStagedNotVisible,
		"TxRollbackDiscards":            testTxRollback,
		"TxFailedAppendStagesNothing":   testTxFailedAppendStagesNothing,
		"TxDone":                        testTxDone,
	}, func(t *testing.T, fn func(*testing.T, Harness)) { fn(t, newHarness(t)) })
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func newEvent(stream, typ string, expected int64, n int) eventstore.NewEvent {
	return eventstore.NewEvent{
		Stream:          stream,
		Type:            typ,
		Data:            json.RawMessage(fmt.Sprintf(`{"n": %d}`, n)),
		ExpectedVersion: expected,
	}
}

func appendOK(t *testing.T, a eventstore.Appender, events ...eventstore.NewEvent) []eventstore.Event {
	t.Helper()
	out, err := a.Append(t.Context(), events)
	require.NoError(t, err)
	require.Len(t, out, len(events))
	return out
}

// requireJSON compares JSON values by meaning (PostgreSQL's jsonb does not
// keep the bytes); nil and empty are the same.
func requireJSON(t *testing.T, want, got json.RawMessage, field string) {
	t.Helper()
	if len(want) == 0 || string(want) == "null" {
		require.True(t, len(got) == 0 || string(got) == "null", "%s: want none, got %s", field, got)
		return
	}
	require.JSONEq(t, string(want), string(got), field)
}

func requireSameEvents(t *testing.T, want, got []eventstore.Event) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, w.ID, g.ID, "event %d id", i)
		require.Equal(t, w.Stream, g.Stream, "event %d stream", i)
		require.Equal(t, w.Type, g.Type, "event %d type", i)
		require.Equal(t, w.Position, g.Position, "event %d position", i)
		require.Equal(t, w.GlobalPosition, g.GlobalPosition, "event %d global position", i)
		require.True(t, w.Time.Equal(g.Time), "event %d time: want %v, got %v", i, w.Time, g.Time)
		requireJSON(t, w.Data, g.Data, fmt.Sprintf("event %d data", i))
		requireJSON(t, w.Metadata, g.Metadata, fmt.Sprintf("event %d metadata", i))
	}
}

func readAll(t *testing.T, s eventstore.Store) []eventstore.Event {
	t.Helper()
	evs, err := s.ReadAll(t.Context(), 0, 0)
	require.NoError(t, err)
	return evs
}

func streamVersion(t *testing.T, s interface {
	StreamVersion(context.Context, string) (int64, error)
}, stream string) int64 {
	t.Helper()
	v, err := s.StreamVersion(t.Context(), stream)
	require.NoError(t, err)
	return v
}

func testAppendAndRead(t *testing.T, h Harness) {
	ctx := t.Context()
	require.Equal(t, eventstore.NoStream, streamVersion(t, h.Store, "order-1"))

	in := []eventstore.NewEvent{
		newEvent("order-1", "OrderPlaced", eventstore.NoStream, 1),
		newEvent("order-1", "OrderPaid", 0, 2),
		newEvent("order-1", "OrderShipped", 1, 3),
	}
	in[0].Metadata = json.RawMessage(`{"correlation_id":"c-1"}`)
	out := appendOK(t, h.Store, in...)
	ids := map[string]bool{}
	for i, e := range out {
		require.Regexp(t, uuidRE, e.ID, "an empty id gets a UUID")
		require.False(t, ids[e.ID], "ids are unique")
		ids[e.ID] = true
		require.Equal(t, "order-1", e.Stream)
		require.Equal(t, in[i].Type, e.Type)
		require.Equal(t, int64(i), e.Position)
		require.False(t, e.Time.IsZero())
		requireJSON(t, in[i].Data, e.Data, "data")
		requireJSON(t, in[i].Metadata, e.Metadata, "metadata")
		if i > 0 {
			require.Greater(t, e.GlobalPosition, out[i-1].GlobalPosition)
		} else {
			require.GreaterOrEqual(t, e.GlobalPosition, int64(1))
		}
	}
	require.Equal(t, int64(2), streamVersion(t, h.Store, "order-1"))

	got, err := h.Store.ReadStream(ctx, "order-1", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, out, got)
	got, err = h.Store.ReadCategory(ctx, "order", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, out, got)
	requireSameEvents(t, out, readAll(t, h.Store))

	got, err = h.Store.ReadStream(ctx, "order-2", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a stream without events reads empty")
	got, err = h.Store.ReadCategory(ctx, "payment", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a category without events reads empty")

	// The store keeps its own copy of the data.
	in[1].Data[2] = 'X'
	out[1].Data[2] = 'Y'
	got, err = h.Store.ReadStream(ctx, "order-1", 1, 1)
	require.NoError(t, err)
	requireJSON(t, json.RawMessage(`{"n": 2}`), got[0].Data, "data after the caller changed its copies")
}

func testEmptyAppend(t *testing.T, h Harness) {
	out, err := h.Store.Append(t.Context(), nil)
	require.NoError(t, err)
	require.Empty(t, out)
	require.Empty(t, readAll(t, h.Store))
}

func testCallerIDs(t *testing.T, h Harness) {
	ctx := t.Context()
	const id = "6F9619FF-8B86-4011-B42D-00C04FC964FF"
	e := newEvent("order-1", "OrderPlaced", eventstore.NoStream, 1)
	e.ID = id
	out := appendOK(t, h.Store, e)
	require.Equal(t, "6f9619ff-8b86-4011-b42d-00c04fc964ff", out[0].ID, "ids are stored in canonical lower case")

	// The same id again, even in another stream and case, is a duplicate.
	again := newEvent("order-2", "OrderPlaced", eventstore.AnyVersion, 2)
	again.ID = "6f9619ff-8b86-4011-b42d-00c04fc964ff"
	_, err := h.Store.Append(ctx, []eventstore.NewEvent{again})
	require.ErrorIs(t, err, eventstore.ErrDuplicateID)

	// Twice in one batch is a duplicate too, and nothing of the batch lands.
	a := newEvent("order-3", "OrderPlaced", eventstore.AnyVersion, 3)
	a.ID = "00000000-0000-4000-8000-000000000001"
	b := a
	b.Stream = "order-4"
	_, err = h.Store.Append(ctx, []eventstore.NewEvent{a, b})
	require.ErrorIs(t, err, eventstore.ErrDuplicateID)
	requireSameEvents(t, out, readAll(t, h.Store))
}

func testPositionsGapless(t *testing.T, h Harness) {
	ctx := t.Context()
	streams := []string{"order-1", "order-2", "payment-1", "order-1", "payment-1", "order-1", "shipping-9", "order-2"}
	for round := range 3 {
		for i, s := range streams {
			appendOK(t, h.Store, newEvent(s, "Happened", eventstore.AnyVersion, round*100+i))
		}
	}
	// Some more in batches spanning streams.
	appendOK(t, h.Store,
		newEvent("order-1", "Happened", eventstore.AnyVersion, 1000),
		newEvent("payment-1", "Happened", eventstore.AnyVersion, 1001),
		newEvent("order-1", "Happened", eventstore.AnyVersion, 1002),
	)

	all := readAll(t, h.Store)
	require.Len(t, all, 3*len(streams)+3)
	next := map[string]int64{}
	for i, e := range all {
		if i > 0 {
			require.Greater(t, e.GlobalPosition, all[i-1].GlobalPosition, "global positions strictly increase")
		}
		require.Equal(t, next[e.Stream], e.Position, "positions of %s are gapless from 0", e.Stream)
		next[e.Stream]++
	}
	for s, n := range next {
		require.Equal(t, n-1, streamVersion(t, h.Store, s))
		evs, err := h.Store.ReadStream(ctx, s, 0, 0)
		require.NoError(t, err)
		require.Len(t, evs, int(n))
		for i, e := range evs {
			require.Equal(t, int64(i), e.Position)
		}
	}
}

func testInclusiveReads(t *testing.T, h Harness) {
	ctx := t.Context()
	var all []eventstore.Event
	for i := range 6 {
		stream := "order-1"
		if i%2 == 1 {
			stream = "payment-1"
		}
		all = append(all, appendOK(t, h.Store, newEvent(stream, "Happened", eventstore.AnyVersion, i))...)
	}
	orders := []eventstore.Event{all[0], all[2], all[4]}

	got, err := h.Store.ReadStream(ctx, "order-1", 1, 0)
	require.NoError(t, err)
	requireSameEvents(t, orders[1:], got)
	got, err = h.Store.ReadStream(ctx, "order-1", 2, 0)
	require.NoError(t, err)
	requireSameEvents(t, orders[2:], got)
	got, err = h.Store.ReadStream(ctx, "order-1", 3, 0)
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = h.Store.ReadStream(ctx, "order-1", -5, 0)
	require.NoError(t, err)
	requireSameEvents(t, orders, got)

	for i, e := range all {
		got, err := h.Store.ReadAll(ctx, e.GlobalPosition, 0)
		require.NoError(t, err)
		requireSameEvents(t, all[i:], got)
	}
	got, err = h.Store.ReadAll(ctx, all[5].GlobalPosition+1, 0)
	require.NoError(t, err)
	require.Empty(t, got)

	// A category read from an event of another category starts at the next
	// event of its own.
	got, err = h.Store.ReadCategory(ctx, "order", all[1].GlobalPosition, 0)
	require.NoError(t, err)
	requireSameEvents(t, orders[1:], got)
	got, err = h.Store.ReadCategory(ctx, "order", all[2].GlobalPosition, 0)
	require.NoError(t, err)
	requireSameEvents(t, orders[1:], got)
	got, err = h.Store.ReadCategory(ctx, "order", all[4].GlobalPosition+1, 0)
	require.NoError(t, err)
	require.Empty(t, got)
}

func testLimits(t *testing.T, h Harness) {
	ctx := t.Context()
	var all []eventstore.Event
	for i := range 10 {
		all = append(all, appendOK(t, h.Store, newEvent("order-1", "Happened", eventstore.AnyVersion, i))...)
	}

	got, err := h.Store.ReadStream(ctx, "order-1", 3, 4)
	require.NoError(t, err)
	requireSameEvents(t, all[3:7], got)
	got, err = h.Store.ReadCategory(ctx, "order", all[3].GlobalPosition, 4)
	require.NoError(t, err)
	requireSameEvents(t, all[3:7], got)
	got, err = h.Store.ReadAll(ctx, all[3].GlobalPosition, 4)
	require.NoError(t, err)
	requireSameEvents(t, all[3:7], got)

	for _, limit := range []int{0, -1, 11, 100} {
		got, err = h.Store.ReadAll(ctx, 0, limit)
		require.NoError(t, err)
		requireSameEvents(t, all, got)
	}

	// Paging from the last position plus one visits every event once.
	for _, size := range []int{1, 3, 10} {
		var paged []eventstore.Event
		from := int64(0)
		for {
			page, err := h.Store.ReadCategory(ctx, "order", from, size)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page), size)
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			from = page[len(page)-1].GlobalPosition + 1
		}
		requireSameEvents(t, all, paged)
	}
}

// testByteBoundedReads: ReadStreamBytes stops before the event that would
// take a page past its byte bound, always returns the first event, and
// paging by it visits every event once.
func testByteBoundedReads(t *testing.T, h Harness) {
	ctx := t.Context()
	for i := range 12 {
		ev := newEvent("order-1", "Happened", eventstore.AnyVersion, i)
		// Sizes vary: 1, 4 and 16 KiB of payload.
		ev.Data = json.RawMessage(fmt.Sprintf(`{"n": %d, "pad": %q}`, i, strings.Repeat("x", 1<<(10+2*(i%3)))))
		appendOK(t, h.Store, ev)
	}
	all, err := h.Store.ReadStream(ctx, "order-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 12)

	// want is the page the rule gives, from the sizes as the store
	// returns them (jsonb does not keep the bytes).
	want := func(from, limit, maxBytes int) []eventstore.Event {
		page, size := []eventstore.Event{}, 0
		for _, e := range all[from:min(len(all), from+limit)] {
			if size += e.Size(); size > maxBytes && len(page) > 0 {
				break
			}
			page = append(page, e)
		}
		return page
	}
	for _, tc := range []struct{ from, limit, maxBytes int }{
		{0, 12, 1}, // smaller than any event: the first alone
		{0, 12, all[0].Size() + all[1].Size()},
		{0, 12, all[0].Size() + all[1].Size() - 1},
		{2, 12, 40 << 10},
		{0, 3, 1 << 30}, // the count bounds first
		{0, 12, 1 << 30},
		{11, 12, 1},
	} {
		got, err := h.Store.ReadStreamBytes(ctx, "order-1", int64(tc.from), tc.limit, tc.maxBytes)
		require.NoError(t, err)
		requireSameEvents(t, want(tc.from, tc.limit, tc.maxBytes), got)
	}
	got, err := h.Store.ReadStreamBytes(ctx, "order-1", 12, 0, 1)
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = h.Store.ReadStreamBytes(ctx, "order-1", 0, 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, all, got)

	// Paging by bytes from the last position plus one visits every event
	// once.
	var paged []eventstore.Event
	for from := int64(0); ; {
		page, err := h.Store.ReadStreamBytes(ctx, "order-1", from, 0, 20<<10)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		from = page[len(page)-1].Position + 1
	}
	requireSameEvents(t, all, paged)
	_, err = h.Store.ReadStreamBytes(ctx, "order", 0, 0, 1)
	require.ErrorIs(t, err, eventstore.ErrInvalid)
}

func testDefaultLimit(t *testing.T, h Harness) {
	ctx := t.Context()
	in := make([]eventstore.NewEvent, eventstore.DefaultLimit+1)
	for i := range in {
		in[i] = newEvent("order-1", "Happened", eventstore.AnyVersion, i)
	}
	appendOK(t, h.Store, in...)
	for _, limit := range []int{0, -1} {
		got, err := h.Store.ReadStream(ctx, "order-1", 0, limit)
		require.NoError(t, err)
		require.Len(t, got, eventstore.DefaultLimit)
		got, err = h.Store.ReadCategory(ctx, "order", 0, limit)
		require.NoError(t, err)
		require.Len(t, got, eventstore.DefaultLimit)
		got, err = h.Store.ReadAll(ctx, 0, limit)
		require.NoError(t, err)
		require.Len(t, got, eventstore.DefaultLimit)
	}
}

func testCategoryIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	require.Equal(t, "order", eventstore.Category("order-a-b"))

	o1 := appendOK(t, h.Store, newEvent("order-1", "Happened", eventstore.NoStream, 1))
	os1 := appendOK(t, h.Store, newEvent("orders-1", "Happened", eventstore.NoStream, 2))
	oab := appendOK(t, h.Store, newEvent("order-a-b", "Happened", eventstore.NoStream, 3))
	oa := appendOK(t, h.Store, newEvent("order-a", "Happened", eventstore.NoStream, 4))

	got, err := h.Store.ReadCategory(ctx, "order", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, append(append(o1, oab...), oa...), got)
	got, err = h.Store.ReadCategory(ctx, "orders", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, os1, got)
	got, err = h.Store.ReadCategory(ctx, "orde", 0, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a category is matched exactly, not by prefix")

	// order-a and order-a-b are different streams of one category.
	got, err = h.Store.ReadStream(ctx, "order-a", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, oa, got)
	got, err = h.Store.ReadStream(ctx, "order-a-b", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, oab, got)
	require.Equal(t, int64(0), streamVersion(t, h.Store, "order-a-b"))
}

// testCategoryBackward pins eventstore.BackwardReader, an optional
// ability: a store without it skips the case.
func testCategoryBackward(t *testing.T, h Harness) {
	br, ok := h.Store.(eventstore.BackwardReader)
	if !ok {
		t.Skip("the store is not an eventstore.BackwardReader (optional)")
	}
	ctx := t.Context()
	var order []eventstore.Event // the category's events, oldest first
	appendOK(t, h.Store, newEvent("payment-1", "Happened", eventstore.NoStream, 100))
	for i := range 6 {
		order = append(order, appendOK(t, h.Store, newEvent(fmt.Sprintf("order-%d", i%2), "Happened", eventstore.AnyVersion, i))...)
		appendOK(t, h.Store, newEvent("orders-1", "Happened", eventstore.AnyVersion, 200+i))
		if i%3 == 0 {
			appendOK(t, h.Store, newEvent("payment-1", "Happened", eventstore.AnyVersion, 300+i))
		}
	}
	head := readAll(t, h.Store)
	last := head[len(head)-1].GlobalPosition
	back := func(toGlobal int64, limit int) []eventstore.Event {
		t.Helper()
		got, err := br.ReadCategoryBackward(ctx, "order", 0, toGlobal, limit)
		require.NoError(t, err)
		return got
	}
	// want is order's events at or below to, newest first, at most limit.
	want := func(to int64, limit int) []eventstore.Event {
		var out []eventstore.Event
		for i := len(order) - 1; i >= 0 && len(out) < limit; i-- {
			if order[i].GlobalPosition <= to {
				out = append(out, order[i])
			}
		}
		return out
	}
	same := func(want, got []eventstore.Event, msg string) {
		t.Helper()
		require.Len(t, got, len(want), msg)
		for i := range want {
			require.Equal(t, want[i].GlobalPosition, got[i].GlobalPosition, "%s: event %d global position", msg, i)
			requireJSON(t, want[i].Data, got[i].Data, fmt.Sprintf("%s: event %d data", msg, i))
		}
	}
	same(want(last, 100), back(last+1000, 0), "toGlobal beyond the head: the whole category, newest first")
	same(want(last, 100), back(last, 100), "toGlobal at the head")
	for _, ev := range order {
		same(want(ev.GlobalPosition, 100), back(ev.GlobalPosition, 100), fmt.Sprintf("toGlobal at an event of the category (%d): inclusive", ev.GlobalPosition))
		same(want(ev.GlobalPosition-1, 100), back(ev.GlobalPosition-1, 100), fmt.Sprintf("toGlobal at another category's event (%d)", ev.GlobalPosition-1))
	}
	require.Empty(t, back(order[0].GlobalPosition-1, 0), "toGlobal below the category's first event")
	require.Empty(t, back(0, 0), "toGlobal 0")
	require.Empty(t, back(-1, 0), "toGlobal negative")
	same(want(last, 2), back(last, 2), "limit")
	same(want(order[4].GlobalPosition, 3), back(order[4].GlobalPosition, 3), "limit below the head")
	same(want(last, 1), back(last, 1), "limit 1")
	// The lower bound is exclusive, and the read stops there whatever
	// the limit.
	for _, after := range []int64{order[1].GlobalPosition, order[1].GlobalPosition + 1, order[4].GlobalPosition} {
		got, err := br.ReadCategoryBackward(ctx, "order", after, last, 100)
		require.NoError(t, err)
		var w []eventstore.Event
		for _, ev := range want(last, 100) {
			if ev.GlobalPosition > after {
				w = append(w, ev)
			}
		}
		same(w, got, fmt.Sprintf("afterGlobal %d: only the events above it", after))
	}
	got, err := br.ReadCategoryBackward(ctx, "order", last, last, 0)
	require.NoError(t, err)
	require.Empty(t, got, "an empty range")

	got, err = br.ReadCategoryBackward(ctx, "orders", 0, last, 0)
	require.NoError(t, err)
	require.Len(t, got, 6, "a category is matched exactly")
	got, err = br.ReadCategoryBackward(ctx, "orde", 0, last, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a category is matched exactly, not by prefix")
	got, err = br.ReadCategoryBackward(ctx, "invoice", 0, last, 0)
	require.NoError(t, err)
	require.Empty(t, got, "a category without events")

	_, err = br.ReadCategoryBackward(ctx, "order-1", 0, last, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "a stream is not a category")
	_, err = br.ReadCategoryBackward(ctx, "", 0, last, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "an empty category")
	_, err = br.ReadCategoryBackward(ctx, "\xc3", 0, last, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "a category that is not UTF-8")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = br.ReadCategoryBackward(cancelled, "order", 0, last, 0)
	require.ErrorIs(t, err, context.Canceled)
}

func testInvalidInput(t *testing.T, h Harness) {
	ctx := t.Context()
	good := newEvent("order-1", "Happened", eventstore.AnyVersion, 0)
	bad := map[string]func(e *eventstore.NewEvent){
		"empty stream":          func(e *eventstore.NewEvent) { e.Stream = "" },
		"stream without id":     func(e *eventstore.NewEvent) { e.Stream = "order" },
		"stream with empty id":  func(e *eventstore.NewEvent) { e.Stream = "order-" },
		"stream with empty cat": func(e *eventstore.NewEvent) { e.Stream = "-1" },
		"empty type":            func(e *eventstore.NewEvent) { e.Type = "" },
		"data not JSON":         func(e *eventstore.NewEvent) { e.Data = json.RawMessage(`{"n":`) },
		"metadata not JSON":     func(e *eventstore.NewEvent) { e.Metadata = json.RawMessage(`nope`) },
		"id not a UUID":         func(e *eventstore.NewEvent) { e.ID = "order-1-0" },
		"expected version < -2": func(e *eventstore.NewEvent) { e.ExpectedVersion = -3 },
		// jsonb cannot store U+0000: both stores refuse it before the
		// database, the same way.
		"data holds NUL":     func(e *eventstore.NewEvent) { e.Data = json.RawMessage(`{"s":"a\u0000b"}`) },
		"metadata holds NUL": func(e *eventstore.NewEvent) { e.Metadata = json.RawMessage(`{"\u0000":1}`) },
		// Nor a lone surrogate or bytes that are not UTF-8 (encoding/json
		// accepts both).
		"data holds a lone high surrogate": func(e *eventstore.NewEvent) { e.Data = json.RawMessage(`{"s":"\ud83d"}`) },
		"data holds a lone low surrogate":  func(e *eventstore.NewEvent) { e.Data = json.RawMessage(`{"s":"\uDE00x"}`) },
		"metadata key holds a surrogate":   func(e *eventstore.NewEvent) { e.Metadata = json.RawMessage(`{"\ud800\u0041":1}`) },
		"data not UTF-8":                   func(e *eventstore.NewEvent) { e.Data = json.RawMessage("{\"s\":\"\xff\"}") },
		// PostgreSQL's text holds neither a NUL nor bytes that are not
		// UTF-8 (a guest's "\u0000" in a stream name decodes to a NUL).
		"stream holds NUL":   func(e *eventstore.NewEvent) { e.Stream = "order-1\x00" },
		"type holds NUL":     func(e *eventstore.NewEvent) { e.Type = "Happened\x00" },
		"stream not UTF-8":   func(e *eventstore.NewEvent) { e.Stream = "order-\xff" },
		"category not UTF-8": func(e *eventstore.NewEvent) { e.Stream = "\xc3-1" },
		"type not UTF-8":     func(e *eventstore.NewEvent) { e.Type = "\xe2\x82" },
	}
	for name, mutate := range bad {
		e := good
		mutate(&e)
		_, err := h.Store.Append(ctx, []eventstore.NewEvent{good, e})
		require.ErrorIs(t, err, eventstore.ErrInvalid, name)
	}
	require.Empty(t, readAll(t, h.Store), "no invalid batch lands")

	nul := good
	nul.Type, nul.Data = "Noted", json.RawMessage(`{"s":"\u0000"}`)
	_, err := h.Store.Append(ctx, []eventstore.NewEvent{nul})
	require.ErrorIs(t, err, eventstore.ErrInvalid)
	require.ErrorContains(t, err, "stream order-1: type Noted", "the error names the event")
	// An escaped backslash before u0000 is text, not a NUL.
	text := good
	text.Data = json.RawMessage(`{"s":"\\u0000"}`)
	appendOK(t, h.Store, text)
	// A surrogate pair is one character, and an escaped backslash before
	// ud800 is text.
	pair := good
	pair.Data = json.RawMessage(`{"s":"\ud83d\ude00 \\ud800"}`)
	appendOK(t, h.Store, pair)

	_, err = h.Store.ReadStream(ctx, "order", 0, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "a category is not a stream")
	_, err = h.Store.StreamVersion(ctx, "order")
	require.ErrorIs(t, err, eventstore.ErrInvalid, "a category is not a stream")
	_, err = h.Store.ReadCategory(ctx, "order-1", 0, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "a stream is not a category")
	_, err = h.Store.ReadCategory(ctx, "", 0, 0)
	require.ErrorIs(t, err, eventstore.ErrInvalid, "an empty category")
}

func testCancelledContext(t *testing.T, h Harness) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := h.Store.Append(ctx, []eventstore.NewEvent{newEvent("order-1", "Happened", eventstore.NoStream, 0)})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, readAll(t, h.Store))
}

func requireVersionError(t *testing.T, err error, stream string, expected, actual int64) {
	t.Helper()
	require.ErrorIs(t, err, eventstore.ErrExpectedVersion)
	var ve *eventstore.VersionError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, eventstore.VersionError{Stream: stream, Expected: expected, Actual: actual}, *ve)
}

func testExpectedVersion(t *testing.T, h Harness) {
	ctx := t.Context()
	try := func(stream string, expected int64) error {
		_, err := h.Store.Append(ctx, []eventstore.NewEvent{newEvent(stream, "Happened", expected, 0)})
		return err
	}

	requireVersionError(t, try("order-1", 0), "order-1", 0, eventstore.NoStream)
	requireVersionError(t, try("order-1", 5), "order-1", 5, eventstore.NoStream)
	require.NoError(t, try("order-1", eventstore.NoStream))
	requireVersionError(t, try("order-1", eventstore.NoStream), "order-1", eventstore.NoStream, 0)
	requireVersionError(t, try("order-1", 1), "order-1", 1, 0)
	require.NoError(t, try("order-1", 0))
	require.NoError(t, try("order-1", eventstore.AnyVersion))
	require.NoError(t, try("order-2", eventstore.AnyVersion), "AnyVersion starts a stream too")
	requireVersionError(t, try("order-1", 1), "order-1", 1, 2)
	require.NoError(t, try("order-1", 2))

	require.Equal(t, int64(3), streamVersion(t, h.Store, "order-1"))
	require.Equal(t, int64(0), streamVersion(t, h.Store, "order-2"))
	require.Len(t, readAll(t, h.Store), 5)
}

func testExpectedVersionWithinBatch(t *testing.T, h Harness) {
	ctx := t.Context()
	// Each checked event counts the batch's earlier events of its stream;
	// unchecked ones just follow.
	out := appendOK(t, h.Store,
		newEvent("order-1", "A", eventstore.NoStream, 0),
		newEvent("order-1", "B", eventstore.AnyVersion, 1),
		newEvent("payment-1", "C", eventstore.NoStream, 2),
		newEvent("order-1", "D", 1, 3),
		newEvent("payment-1", "E", 0, 4),
	)
	positions := []int64{0, 1, 0, 2, 1}
	for i, e := range out {
		require.Equal(t, positions[i], e.Position)
	}

	// A check that ignores the batch's earlier events fails the batch.
	_, err := h.Store.Append(ctx, []eventstore.NewEvent{
		newEvent("order-1", "F", 2, 5),
		newEvent("order-1", "G", 2, 6),
	})
	requireVersionError(t, err, "order-1", 2, 3)
	require.Equal(t, int64(2), streamVersion(t, h.Store, "order-1"))

	// Only checked events are checked: the first here is unchecked.
	appendOK(t, h.Store,
		newEvent("order-1", "F", eventstore.AnyVersion, 5),
		newEvent("order-1", "G", 3, 6),
	)
	require.Equal(t, int64(4), streamVersion(t, h.Store, "order-1"))
}

func testBatchAtomicity(t *testing.T, h Harness) {
	ctx := t.Context()
	before := appendOK(t, h.Store,
		newEvent("order-1", "A", eventstore.NoStream, 0),
		newEvent("payment-1", "B", eventstore.NoStream, 1),
	)
	failing := map[string][]eventstore.NewEvent{
		"last event conflicts": {
			newEvent("order-1", "C", 0, 2),
			newEvent("shipping-1", "D", eventstore.NoStream, 3),
			newEvent("payment-1", "E", 7, 4),
		},
		"first event conflicts": {
			newEvent("payment-1", "E", eventstore.NoStream, 4),
			newEvent("order-1", "C", 0, 2),
		},
		"middle event invalid": {
			newEvent("order-1", "C", 0, 2),
			newEvent("order", "D", eventstore.AnyVersion, 3),
			newEvent("payment-1", "E", 0, 4),
		},
	}
	for name, batch := range failing {
		_, err := h.Store.Append(ctx, batch)
		require.Error(t, err, name)
		requireSameEvents(t, before, readAll(t, h.Store))
		require.Equal(t, int64(0), streamVersion(t, h.Store, "order-1"), name)
		require.Equal(t, eventstore.NoStream, streamVersion(t, h.Store, "shipping-1"), name)
	}
	// The same batch, fixed, lands whole.
	out := appendOK(t, h.Store,
		newEvent("order-1", "C", 0, 2),
		newEvent("shipping-1", "D", eventstore.NoStream, 3),
		newEvent("payment-1", "E", 0, 4),
	)
	requireSameEvents(t, append(before, out...), readAll(t, h.Store))
}

// raceRounds repeats each race: a missing lock shows only when goroutines
// interleave inside the store's check-then-write window, which one round
// rarely hits on a fast store.
const raceRounds = 100

func testConcurrentWritersOneWins(t *testing.T, h Harness) {
	for _, n := range []int{2, 8, 32} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			for round := range raceRounds {
				raceOnce(t, h, fmt.Sprintf("order-race%dx%d", n, round), n)
			}
		})
	}
}

// raceOnce lets n writers append to stream from one base version at once.
func raceOnce(t *testing.T, h Harness, stream string, n int) {
	ctx := t.Context()
	seed := appendOK(t, h.Store,
		newEvent(stream, "Seeded", eventstore.NoStream, 0),
		newEvent(stream, "Seeded", 0, 1),
	)
	base := seed[1].Position

	start := make(chan struct{})
	results := make([]error, n)
	won := make([][]eventstore.Event, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			won[i], results[i] = h.Store.Append(ctx, []eventstore.NewEvent{
				newEvent(stream, "Raced", base, i),
				newEvent(stream, "Raced", eventstore.AnyVersion, i),
			})
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range results {
		if err == nil {
			require.Equal(t, -1, winner, "%s: writers %d and %d both won", stream, winner, i)
			winner = i
			continue
		}
		requireVersionError(t, err, stream, base, base+2)
	}
	require.NotEqual(t, -1, winner, "%s: no writer won", stream)

	got, err := h.Store.ReadStream(ctx, stream, 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, append(seed, won[winner]...), got)
}

func testConcurrentWritersNoLostAppend(t *testing.T, h Harness) {
	ctx := t.Context()
	const writers, each = 32, 5
	start := make(chan struct{})
	errs := make([]error, writers)
	var mu sync.Mutex
	appended := map[string]bool{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			<-start
			for i := 0; i < each; {
				v, err := h.Store.StreamVersion(ctx, "order-1")
				if err != nil {
					errs[w] = err
					return
				}
				out, err := h.Store.Append(ctx, []eventstore.NewEvent{newEvent("order-1", "Counted", v, w*each+i)})
				if errors.Is(err, eventstore.ErrExpectedVersion) {
					continue
				}
				if err != nil {
					errs[w] = err
					return
				}
				mu.Lock()
				appended[out[0].ID] = true
				mu.Unlock()
				i++
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	got, err := h.Store.ReadStream(ctx, "order-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, writers*each)
	seen := map[string]bool{}
	for i, e := range got {
		require.Equal(t, int64(i), e.Position)
		require.True(t, appended[e.ID], "event %s was not reported appended", e.ID)
		seen[e.ID] = true
	}
	require.Len(t, seen, writers*each, "every appended event is stored once")
}

func begin(t *testing.T, h Harness) Tx {
	t.Helper()
	return suite.Begin(t, h.Begin)
}

func testTxStagedNotVisible(t *testing.T, h Harness) {
	ctx := t.Context()
	before := appendOK(t, h.Store, newEvent("order-1", "A", eventstore.NoStream, 0))

	tx := begin(t, h)
	staged := appendOK(t, tx,
		newEvent("order-1", "B", 0, 1),
		newEvent("order-2", "C", eventstore.NoStream, 2),
	)
	more := appendOK(t, tx, newEvent("order-1", "D", 1, 3))
	staged = append(staged, more...)

	// The transaction sees its own appends...
	require.Equal(t, int64(2), streamVersion(t, tx, "order-1"))
	require.Equal(t, int64(0), streamVersion(t, tx, "order-2"))
	got, err := tx.ReadStream(ctx, "order-1", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, []eventstore.Event{before[0], staged[0], staged[2]}, got)
	got, err = tx.ReadStream(ctx, "order-1", 2, 0)
	require.NoError(t, err)
	requireSameEvents(t, staged[2:], got)

	// ...and nobody else does.
	require.Equal(t, int64(0), streamVersion(t, h.Store, "order-1"))
	require.Equal(t, eventstore.NoStream, streamVersion(t, h.Store, "order-2"))
	requireSameEvents(t, before, readAll(t, h.Store))
	got, err = h.Store.ReadCategory(ctx, "order", 0, 0)
	require.NoError(t, err)
	requireSameEvents(t, before, got)

	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, int64(2), streamVersion(t, h.Store, "order-1"))
	requireSameEvents(t, append(before, staged...), readAll(t, h.Store))

	require.NoError(t, tx.Rollback(ctx), "rollback after commit is a no-op")
	requireSameEvents(t, append(before, staged...), readAll(t, h.Store))
}

func testTxRollback(t *testing.T, h Harness) {
	ctx := t.Context()
	tx := begin(t, h)
	appendOK(t, tx, newEvent("order-1", "A", eventstore.NoStream, 0))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, tx.Rollback(ctx), "rollback twice is a no-op")
	require.Empty(t, readAll(t, h.Store))
	require.Equal(t, eventstore.NoStream, streamVersion(t, h.Store, "order-1"))

	// The store is free for the next writer, and the stream starts afresh.
	out := appendOK(t, h.Store, newEvent("order-1", "B", eventstore.NoStream, 1))
	require.Equal(t, int64(0), out[0].Position)
}

func testTxFailedAppendStagesNothing(t *testing.T, h Harness) {
	ctx := t.Context()
	tx := begin(t, h)
	a := appendOK(t, tx, newEvent("order-1", "A", eventstore.NoStream, 0))
	_, err := tx.Append(ctx, []eventstore.NewEvent{
		newEvent("order-1", "B", 0, 1),
		newEvent("order-2", "C", eventstore.NoStream, 2),
		newEvent("order-1", "D", 0, 3), // the stream is at 1 by now
	})
	requireVersionError(t, err, "order-1", 0, 1)
	_, err = tx.Append(ctx, []eventstore.NewEvent{newEvent("order-1", "E", eventstore.NoStream, 4)})
	requireVersionError(t, err, "order-1", eventstore.NoStream, 0)
	require.Equal(t, int64(0), streamVersion(t, tx, "order-1"))
	require.Equal(t, eventstore.NoStream, streamVersion(t, tx, "order-2"))

	f := appendOK(t, tx, newEvent("order-1", "F", 0, 5))
	require.Equal(t, int64(1), f[0].Position)
	require.NoError(t, tx.Commit(ctx))
	requireSameEvents(t, append(a, f...), readAll(t, h.Store))
}

func testTxDone(t *testing.T, h Harness) {
	ctx := t.Context()
	tx := begin(t, h)
	appendOK(t, tx, newEvent("order-1", "A", eventstore.NoStream, 0))
	require.NoError(t, tx.Commit(ctx))
	_, err := tx.Append(ctx, []eventstore.NewEvent{newEvent("order-1", "B", 0, 1)})
	require.ErrorIs(t, err, eventstore.ErrTxDone)

	tx = begin(t, h)
	appendOK(t, tx, newEvent("order-1", "B", 0, 1))
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Commit(ctx), eventstore.ErrTxDone, "commit after rollback fails")
	_, err = tx.Append(ctx, []eventstore.NewEvent{newEvent("order-1", "B", 0, 1)})
	require.ErrorIs(t, err, eventstore.ErrTxDone)
	require.Len(t, readAll(t, h.Store), 1)
}
