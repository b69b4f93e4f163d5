package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// examplesEngine runs the example modules on memory stores and a started
// inline broker that nothing relays to: a test publishes by hand, so it
// decides when the projector gets an event.
func examplesEngine(t *testing.T, beforeStart ...func(*unitofwork.Memory)) (*Engine, *unitofwork.Memory, *broker.Inline) {
	t.Helper()
	return startExamples(t, func(mem *unitofwork.Memory) Options {
		for _, f := range beforeStart {
			f(mem)
		}
		return Options{Events: mem.Events, Records: mem.Records, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default", Keys: nil})}
	})
}

// startExamples starts an engine on the example modules with the options
// opts gives for a fresh memory backend, its consumers on an inline broker.
func startExamples(t *testing.T, opts func(*unitofwork.Memory) Options) (*Engine, *unitofwork.Memory, *broker.Inline) {
	t.Helper()
	set := exampleSet(t)
	mem := unitofwork.NewMemory()
	o := opts(mem)
	progress := &groups.Progress{}
	o.BrokerProgress = progress
	e := New(set, o)
	src, err := broker.NewInline(broker.DefaultOptions())
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	startGroups(t, e, src, groups.Options{Progress: progress})
	return e, mem, src
}

// exampleSet loads the example modules.
func exampleSet(t *testing.T) *host.Set {
	t.Helper()
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	set, errs := host.LoadSet(context.Background(), l, wasmbuild.Examples(t), host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, errs)
	return set
}

// placeOrder places order for client and answers its event's position.
func placeOrder(t *testing.T, e *Engine, order, client string) int64 {
	t.Helper()
	res, err := e.Dispatch(context.Background(), "PlaceOrder", json.RawMessage(fmt.Sprintf(`{"order_id":%q,"client_id":%q,"total":1}`, order, client)), abi.Metadata{})
	require.NoError(t, err)
	return res.Events[0].GlobalPosition
}

// waitDocument waits up to d for client_orders' document id as of n.
func waitDocument(e *Engine, id string, n int64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return e.WaitDocument(ctx, "client_orders", id, n)
}

// publish hands the stored event at global position gp to the broker, as
// the relay would.
func publish(t *testing.T, mem *unitofwork.Memory, src *broker.Inline, gp int64) {
	t.Helper()
	evs, err := mem.Events.ReadAll(context.Background(), gp, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	ev := evs[0]
	cat := eventstore.Category(ev.Stream)
	require.NoError(t, src.Publish(context.Background(), delivery.Message{ID: ev.ID, Stream: cat, Type: ev.Type, Data: ev.Data,
		EventStream: ev.Stream, Category: cat, Position: ev.Position, GlobalPosition: ev.GlobalPosition, Time: ev.Time}))
}

func waitFor(e *Engine, name string, n int64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return e.WaitHandled(ctx, name, n)
}

// A projector that has not handled an event of its category at or below N
// is not caught up (the wait runs into its bound); once it has, it is, and
// events of categories it does not read never hold it back.
func TestWaitHandled(t *testing.T) {
	e, mem, src := examplesEngine(t)
	ctx := context.Background()
	place := func(i int) int64 {
		res, err := e.Dispatch(ctx, "PlaceOrder", json.RawMessage(fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i)), abi.Metadata{})
		require.NoError(t, err)
		return res.Events[0].GlobalPosition
	}
	require.NoError(t, waitFor(e, "client_orders", 0, time.Minute), "position 0: nothing to wait for")
	p1, p2 := place(1), place(2)

	// Stalled: nothing reached the projector.
	err := waitFor(e, "client_orders", p1, 100*time.Millisecond)
	require.ErrorIs(t, err, readyourwrites.ErrNotCaughtUp)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), fmt.Sprintf("projection client_orders has not handled global position %d", p1))

	// The second event handled first (another key's order, say) does not
	// make the first count as handled.
	publish(t, mem, src, p2)
	testwait.For(t, "the projector handled o-2", func() (bool, string) {
		_, _, err := e.Projection(ctx, "client_orders", "c-1")
		return err == nil, fmt.Sprint(err)
	})
	require.ErrorIs(t, waitFor(e, "client_orders", p1, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp)
	require.ErrorIs(t, waitFor(e, "client_orders", p2, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "p1 is below p2 and unhandled")

	// A waiter blocked before the event is handled returns once it is.
	waited := make(chan error, 1)
	go func() { waited <- waitFor(e, "client_orders", p2, time.Minute) }()
	publish(t, mem, src, p1)
	require.NoError(t, testwait.Recv(t, "the wait for p2", waited))
	require.NoError(t, waitFor(e, "client_orders", p1, time.Minute))

	// fulfillment does not read category order: order's events never hold
	// it back, but a payment it has not handled does.
	require.NoError(t, waitFor(e, "fulfillment", p2, time.Minute))
	res, err := e.Dispatch(ctx, "RecordPayment", json.RawMessage(`{"payment_id":"p-1","order_id":"o-1","amount":1}`), abi.Metadata{})
	require.NoError(t, err)
	pay := res.Events[0].GlobalPosition
	require.ErrorIs(t, waitFor(e, "fulfillment", pay, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp)
	require.NoError(t, waitFor(e, "client_orders", pay, time.Minute), "client_orders does not read payments")
	publish(t, mem, src, pay)
	require.NoError(t, waitFor(e, "fulfillment", pay, time.Minute))

	require.ErrorIs(t, waitFor(e, "orders", 1, time.Minute), ErrUnknownProjection, "a command handler has no projection")
}

// Every event the host appends names the module build that produced it.
func TestEventsNameTheirModule(t *testing.T) {
	e, mem, _ := examplesEngine(t)
	ctx := context.Background()
	res, err := e.Dispatch(ctx, "PlaceOrder", json.RawMessage(`{"order_id":"o-1","client_id":"c-1","total":1}`), abi.Metadata{})
	require.NoError(t, err)
	evs, err := mem.Events.ReadAll(ctx, res.Events[0].GlobalPosition, 1)
	require.NoError(t, err)
	route, ok := e.Set().Command("PlaceOrder")
	require.True(t, ok)
	var md abi.Metadata
	require.NoError(t, json.Unmarshal(evs[0].Metadata, &md))
	require.Equal(t, &abi.ModuleRef{Name: "orders", Version: "1.0.0", SHA256: route.Module.SHA256}, md.Module)
	require.Len(t, route.Module.SHA256, 64)
}

// With broker consumers there is no positions row: an event appended
// before the engine started its consumers (by an earlier process, whose
// inline broker is gone) counts as handled, so a restarted host does not
// wait on it for ever; one appended after does not until it is handled.
func TestWaitHandledAfterRestart(t *testing.T) {
	var old int64
	e, _, _ := examplesEngine(t, func(mem *unitofwork.Memory) {
		evs, err := mem.Events.Append(context.Background(), []eventstore.NewEvent{{Stream: "order-o-0", Type: "OrderPlaced",
			Data: json.RawMessage(`{"order_id":"o-0","client_id":"c-0","total":1}`), ExpectedVersion: eventstore.NoStream}})
		require.NoError(t, err)
		old = evs[0].GlobalPosition
	})
	require.NoError(t, waitFor(e, "client_orders", old, time.Minute))
	res, err := e.Dispatch(context.Background(), "PlaceOrder", json.RawMessage(`{"order_id":"o-1","client_id":"c-1","total":1}`), abi.Metadata{})
	require.NoError(t, err)
	require.ErrorIs(t, waitFor(e, "client_orders", res.Events[0].GlobalPosition, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp)
}

// A read of one document of a projector that declares documents_by_key
// waits for that document's key alone: another key's unhandled event (a
// slow or halted partition) below the position does not hold it back,
// while a wait for the whole projection, or for the other key's document,
// still waits for it.
func TestWaitDocumentWaitsForItsKeyAlone(t *testing.T) {
	e, mem, src := examplesEngine(t)
	place := func(order, client string) int64 { return placeOrder(t, e, order, client) }
	wait := func(id string, n int64, d time.Duration) error { return waitDocument(e, id, n, d) }
	stuck := place("o-1", "c-stuck") // never published: its partition never handles it
	p2, p3 := place("o-2", "c-2"), place("o-3", "c-2")
	require.ErrorIs(t, wait("c-2", p3, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "c-2's events are not handled yet")
	publish(t, mem, src, p2)
	publish(t, mem, src, p3)
	waited := make(chan error, 1)
	go func() { waited <- wait("c-2", p3, time.Minute) }()
	require.NoError(t, testwait.Recv(t, "the wait for c-2's document", waited), "c-stuck's event does not concern c-2's document")
	require.NoError(t, wait("c-2", p3, time.Minute), "again, from what the first wait found")
	require.ErrorIs(t, wait("c-stuck", stuck, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp)
	require.ErrorIs(t, waitFor(e, "client_orders", p3, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "the whole projection waits for every key")

	p4 := place("o-4", "c-2")
	require.ErrorIs(t, wait("c-2", p4, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "a later event of the key is waited for")
	publish(t, mem, src, p4)
	go func() { waited <- wait("c-2", p4, time.Minute) }()
	require.NoError(t, testwait.Recv(t, "the wait for c-2's later event", waited))

	publish(t, mem, src, stuck)
	require.NoError(t, waitFor(e, "client_orders", p4, time.Minute))
	require.NoError(t, wait("c-stuck", p4, time.Minute))
}

// A projector that declares documents_by_key and writes another document
// than its event's key fails that message, permanently.
func TestDocumentsByKeyRefusesAnotherDocument(t *testing.T) {
	h := abi.Handler{Name: "client_orders", Kind: abi.KindProjector, Category: "order", DocumentsByKey: true,
		SequentialBy: abi.SequentialBy{Field: "client_id"}}
	env := abi.Envelope{Type: "OrderPlaced", Data: json.RawMessage(`{"client_id":"c-1"}`)}
	write := func(kind abi.RecordKind, typ, id string) *abi.Effects {
		return &abi.Effects{Writes: []abi.Write{{Kind: kind, Type: typ, ID: id, Data: json.RawMessage(`{}`)}}}
	}
	require.NoError(t, documentsByKey(h, env, write(abi.RecordProjection, "client_orders", "c-1")))
	require.NoError(t, documentsByKey(h, env, write(abi.RecordProjection, "other", "c-2")), "another projection's documents are the scope's business")
	err := documentsByKey(h, env, write(abi.RecordProjection, "client_orders", "c-2"))
	require.ErrorIs(t, err, ErrDocumentKey)
	require.Contains(t, err.Error(), `an event whose client_id is "c-1" writes only that document, but it wrote document "c-2"`)
	require.ErrorIs(t, documentsByKey(h, abi.Envelope{Data: json.RawMessage(`{}`)}, write(abi.RecordProjection, "client_orders", "c-1")), ErrDocumentKey,
		"an event without the key writes no document")

	route := host.Route{Module: &host.Module{File: "x.wasm"}, Handler: h}
	out := checkResults(route, []abi.Envelope{env, env}, []abi.Result{{Effects: write(abi.RecordProjection, "client_orders", "c-1")},
		{Effects: write(abi.RecordProjection, "client_orders", "c-9")}}, &scope{handlers: map[string]abi.Kind{"client_orders": abi.KindProjector, "other": abi.KindProjector}}, nil)
	require.NoError(t, out[0].err)
	require.ErrorIs(t, out[1].err, ErrDocumentKey)
	require.Equal(t, abi.ErrorPermanent, out[1].Result.Error.Kind)
}

// countingEvents counts the category reads a wait makes.
type countingEvents struct {
	eventstore.Store
	reads atomic.Int64
}

func (c *countingEvents) ReadCategory(ctx context.Context, category string, from int64, n int) ([]eventstore.Event, error) {
	c.reads.Add(1)
	return c.Store.ReadCategory(ctx, category, from, n)
}

// With partition workers on other hosts, a read of one document asks the
// positions table for its key's unit alone: the key's events are handled
// once that unit's position (its stream's or lane's) reaches the last of
// them at or below the position asked for, whatever other keys' units
// have done. The wait finds that last event with one walk of the store;
// its later checks (the remote polls) read the positions row alone. Fails
// on the walk per check (every poll read the category again).
func TestWaitDocumentAsksTheKeysUnit(t *testing.T) {
	positions := position.NewMemory(nil)
	var events *countingEvents
	e, _, _ := startExamples(t, func(mem *unitofwork.Memory) Options {
		events = &countingEvents{Store: mem.Events}
		return Options{Events: events, Records: mem.Records, Partitioned: true, Progress: &partition.Progress{Positions: positions},
			UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})}
	})
	ctx := context.Background()
	place := func(order, client string) int64 { return placeOrder(t, e, order, client) }
	wait := func(id string, n int64, d time.Duration) error { return waitDocument(e, id, n, d) }
	handled := func(client string, source string, gp int64) {
		require.NoError(t, positions.Set(ctx, "client_orders", partition.PartitionUnit("order", client), source, gp))
	}
	p1 := place("o-1", "c-1")
	p2 := place("o-2", "c-2") // c-2's is never handled
	p3 := place("o-3", "c-1")

	before := events.reads.Load()
	require.ErrorIs(t, wait("c-1", p3, 300*time.Millisecond), readyourwrites.ErrNotCaughtUp, "nothing handled yet")
	require.LessOrEqual(t, events.reads.Load()-before, int64(1), "one walk for the wait, however many polls")

	handled("c-1", "order:c-1", p1)
	require.ErrorIs(t, wait("c-1", p3, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp, "c-1's later event is not handled")
	handled("c-1", "order:c-1", p3)
	require.NoError(t, wait("c-1", p3, time.Minute), "c-2's unhandled event does not concern c-1's document")
	require.NoError(t, wait("c-1", p2, time.Minute), "c-1's last event at or below p2 is p1")

	require.ErrorIs(t, wait("c-2", p3, 100*time.Millisecond), readyourwrites.ErrNotCaughtUp)
	handled("c-2", "order:c-2:backfill", p2) // the lane's position counts as the stream's
	require.NoError(t, wait("c-2", p3, time.Minute))
	require.NoError(t, wait("c-none", p3, time.Minute), "a key with no event at or below the position waits for nothing")

	// A new key's last event is found searching back from the position:
	// one read, not a walk over every event before it.
	for i := 0; i < 3*512; i++ { // three windows of the search (readyourwrites.walkBatch)
		place(fmt.Sprintf("o-x%d", i), "c-x")
	}
	p4 := place("o-4", "c-new")
	before = events.reads.Load()
	require.ErrorIs(t, wait("c-new", p4, time.Second), readyourwrites.ErrNotCaughtUp) // a second: the first check runs in it even on a busy machine
	require.Zero(t, events.reads.Load()-before, "the reader's own event, committed by this engine: no read")
	handled("c-new", "order:c-new", p4)
	require.NoError(t, wait("c-new", p4, time.Minute))

	// An event this engine did not commit (another host's) is found
	// searching back: one read.
	evs, err := events.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-5", Type: "OrderPlaced",
		Data: json.RawMessage(`{"order_id":"o-5","client_id":"c-elsewhere","total":1}`), ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	p5 := evs[0].GlobalPosition
	before = events.reads.Load()
	require.ErrorIs(t, wait("c-elsewhere", p5, time.Second), readyourwrites.ErrNotCaughtUp)
	require.Equal(t, int64(1), events.reads.Load()-before, "one read for a new key's wait")
	handled("c-elsewhere", "order:c-elsewhere", p5)
	require.NoError(t, wait("c-elsewhere", p5, time.Minute))
}

// On the inline broker, a wait that meets an event its projector's group
// dead-lettered ends at once with an error naming the event and how to
// replay it, not at its bound.
func TestWaitHandledMeetsADeadLetter(t *testing.T) {
	e, mem, src := examplesEngine(t)
	progress := e.opts.BrokerProgress.(*groups.Progress)
	progress.DeadLetters = src
	ctx := context.Background()
	evs, err := mem.Events.Append(ctx, []eventstore.NewEvent{{Stream: "order-bad", Type: "OrderPlaced",
		Data: json.RawMessage(`{"order_id":"bad","client_id":"c-9","total":"not a number"}`), ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	// A wait that began before the event was dead-lettered sees it too
	// (nothing marks a dead letter: the wait polls).
	waited := make(chan error, 1)
	go func() { waited <- waitFor(e, "client_orders", evs[0].GlobalPosition, testwait.Limit()) }()
	publish(t, mem, src, evs[0].GlobalPosition)
	err = <-waited
	require.ErrorIs(t, err, readyourwrites.ErrFailed, "before the bound")
	var de *groups.DeadLetteredError
	require.ErrorAs(t, err, &de)
	require.Equal(t, evs[0].ID, de.Event.ID)
	require.Contains(t, err.Error(), "protean-host dead-letters replay order client_orders "+evs[0].ID)

	err = waitFor(e, "client_orders", evs[0].GlobalPosition, testwait.Limit())
	require.ErrorIs(t, err, readyourwrites.ErrFailed, "a wait that begins after it ends at once")
}
