package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/record"
)

func TestMain(m *testing.M) { testserver.Main(m, wasmbuild.Cleanup) }

// signalingRecords reports each load of an aggregate of type "slow" (the
// Slow command's first step), so a test knows the command is in its
// handler, and holds the load there until the test releases it, so the
// command stays in flight for as long as the test needs, however slow the
// machine.
type signalingRecords struct {
	record.Store
	loaded chan string
	mu     sync.Mutex
	held   map[string]chan struct{}
}

// hold makes the next loads of slow/id wait for release(id).
func (s *signalingRecords) hold(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[id] = make(chan struct{})
}

func (s *signalingRecords) release(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.held[id])
}

func (s *signalingRecords) Load(ctx context.Context, k record.Key) (record.Record, error) {
	if k.Type == "slow" {
		s.loaded <- k.ID
		s.mu.Lock()
		held := s.held[k.ID]
		s.mu.Unlock()
		if held != nil {
			select {
			case <-held:
			case <-ctx.Done():
				return record.Record{}, ctx.Err()
			}
		}
	}
	return s.Store.Load(ctx, k)
}

// generous gives lim's unset guest deadlines (a call, the manifest read at
// load, a compile) the suite's wait limit instead of the production
// defaults (5 s, 2 s, 10 s per MiB): under -race on a busy 2-core machine
// creating an instance or compiling a Go guest can take longer than those,
// and, in these tests, a call also spans a load a test holds open. A test
// of a deadline sets its own.
func generous(lim host.Limits) host.Limits {
	lim.Timeout = cmp.Or(lim.Timeout, testwait.Limit())
	lim.ManifestTimeout = cmp.Or(lim.ManifestTimeout, testwait.Limit())
	lim.CompileTimeout = cmp.Or(lim.CompileTimeout, testwait.Limit())
	return lim
}

func newEngine(t *testing.T, limits ...host.Limits) (*Engine, *signalingRecords) {
	t.Helper()
	var lim host.Limits
	if len(limits) > 0 {
		lim = limits[0]
	}
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(lim), CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	set, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	t.Cleanup(func() { _ = set.Close(context.Background()) })
	mem := unitofwork.NewMemory()
	recs := &signalingRecords{Store: mem.Records, loaded: make(chan string, 16), held: map[string]chan struct{}{}}
	e := New(set, Options{Events: mem.Events, Records: recs, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})})
	return e, recs
}

func TestStopDrainsCommandsInFlight(t *testing.T) {
	e, recs := newEngine(t)
	ctx := context.Background()
	type out struct {
		res *CommandResult
		err error
	}
	recs.hold("a")
	done := make(chan out, 1)
	go func() {
		res, err := e.Dispatch(ctx, "Slow", json.RawMessage(`{"id":"a","ms":0}`), abi.Metadata{})
		done <- out{res, err}
	}()
	require.Equal(t, "a", testwait.Recv(t, "the command in its handler", recs.loaded))

	// What Stop saw when it returned: its error and whether the command's
	// event had been committed by then.
	type stop struct {
		err       error
		committed int
	}
	stopped := make(chan stop, 1)
	go func() {
		err := e.Stop(ctx)
		evs, rerr := e.opts.Events.ReadStream(context.Background(), "slow-a", 0, 0)
		stopped <- stop{errors.Join(err, rerr), len(evs)}
	}()
	// New work is refused as soon as Stop begins…
	testwait.For(t, "the engine to report it is stopping", func() (bool, string) {
		err := e.Healthy()
		return errors.Is(err, ErrStopped), fmt.Sprintf("Healthy() = %v", err)
	})
	_, err := e.Dispatch(ctx, "Slow", json.RawMessage(`{"id":"b","ms":0}`), abi.Metadata{})
	require.ErrorIs(t, err, ErrStopped)
	// …while the command in flight, still held in its handler, keeps Stop
	// waiting…
	select {
	case s := <-stopped:
		t.Fatalf("Stop returned (%v) while a command was in flight", s.err)
	default:
	}
	// …and, released, finishes and commits before Stop returns.
	recs.release("a")
	s := testwait.Recv(t, "Stop to return", stopped)
	require.NoError(t, s.err)
	require.Equal(t, 1, s.committed, "Stop returned before the command in flight committed")
	o := testwait.Recv(t, "the command's result", done)
	require.NoError(t, o.err)
	require.Len(t, o.res.Events, 1)
	require.NoError(t, e.Stop(ctx), "a second Stop is a no-op")
}

func TestStopCancelsAtItsDeadline(t *testing.T) {
	// The module's own deadline is far off: only Stop can end the call.
	e, recs := newEngine(t, host.Limits{Timeout: time.Hour})
	done := make(chan error, 1)
	go func() {
		_, err := e.Dispatch(context.Background(), "Slow", json.RawMessage(`{"id":"a","ms":3600000}`), abi.Metadata{})
		done <- err
	}()
	testwait.Recv(t, "the command in its handler", recs.loaded)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// At its deadline Stop cancels the command, although the command's own
	// context never ends, and the canceled call returns within StopGrace,
	// so nothing is abandoned.
	err := e.Stop(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, ErrAbandoned)
	err = testwait.Recv(t, "the runaway command to end", done)
	require.ErrorIs(t, err, host.ErrCanceled)
	ended(t, e)
}

func TestScopeIsolatesModules(t *testing.T) {
	e, _ := newEngine(t)
	l := e.loaded.Load()
	route := l.set.Subscribers("Op")[0]
	op := func(name string) abi.Envelope {
		return abi.Envelope{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"` + name + `","id":"x","arg":"order-x"}`)}
	}
	// Writing another module's projection fails the message permanently.
	res, err := e.call(context.Background(), l, route, []abi.Envelope{op("foreign")}, documentView{})
	require.NoError(t, err)
	require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind)
	require.Contains(t, res[0].Error.Message, "projection client_orders is not a projector or process manager of the module")
	// Loading an aggregate of a category the module does not declare is
	// refused by the host function.
	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("foreign_load")}, documentView{})
	require.NoError(t, err)
	require.Contains(t, res[0].Error.Message, "may not read aggregates of category order: the module declares no messages on it")
	// The module got a scope error, which the kit does not retry.
	require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind)
	var se *ScopeError
	require.ErrorAs(t, res[0].err, &se)
	// So is reading a stream of such a category.
	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("read")}, documentView{})
	require.NoError(t, err)
	require.Contains(t, res[0].Error.Message, "may not read stream order-x of category order")
	require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind)
	require.ErrorAs(t, res[0].err, &se)
}

func TestScopeErrorsComeOutOfDispatch(t *testing.T) {
	e, _ := newEngine(t)
	for _, op := range []string{"write", "load", "read"} {
		t.Run(op, func(t *testing.T) {
			_, err := e.Dispatch(context.Background(), "Trespass", json.RawMessage(`{"op":"`+op+`","id":"x"}`), abi.Metadata{})
			var se *ScopeError
			require.ErrorAs(t, err, &se, "%v", err)
			require.NotEmpty(t, se.File)
			var he *HandlerError
			require.ErrorAs(t, err, &he)
			require.False(t, he.Retryable(), "a scope violation is not retried: %v", err)
			require.Equal(t, abi.ErrorPermanent, he.Kind)
		})
	}
}

func TestDispatchErrors(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	_, err := e.Dispatch(ctx, "Nope", json.RawMessage(`{}`), abi.Metadata{})
	require.ErrorIs(t, err, ErrUnknownCommand)
	_, err = e.Dispatch(ctx, "Increment", json.RawMessage(`[]`), abi.Metadata{})
	require.ErrorIs(t, err, ErrBadInput)
	// Metadata travels with every event a command causes: it is capped.
	_, err = e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"m"}`), abi.Metadata{CorrelationID: strings.Repeat("c", MaxMetadataBytes)})
	require.ErrorIs(t, err, ErrBadInput)
	require.ErrorContains(t, err, "-byte limit")
	_, err = e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"m"}`), abi.Metadata{CorrelationID: strings.Repeat("c", 255)})
	require.NoError(t, err)
	_, _, err = e.Projection(ctx, "client_orders", "x")
	require.ErrorIs(t, err, ErrUnknownProjection)

	// Racing dispatches on one aggregate: every one either commits or
	// conflicts, and the commits are exactly the counter's value.
	const n = 12
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"c"}`), abi.Metadata{})
			errs <- err
		}()
	}
	ok := 0
	for range n {
		err := testwait.Recv(t, "a racing dispatch's outcome", errs)
		if err != nil {
			require.True(t, unitofwork.Conflict(err), "%v", err)
			continue
		}
		ok++
	}
	r, err := e.opts.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "counter", ID: "c"})
	require.NoError(t, err)
	require.Equal(t, int64(ok), r.Version)
	require.JSONEq(t, `{"n":`+itoa(ok)+`}`, string(r.Data))
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestSwapRetiresTheOldSetAfterItsCalls(t *testing.T) {
	e, recs := newEngine(t)
	old := e.Set()
	recs.hold("a") // in flight until the swap is done
	done := make(chan error, 1)
	go func() {
		_, err := e.Dispatch(context.Background(), "Slow", json.RawMessage(`{"id":"a","ms":0}`), abi.Metadata{})
		done <- err
	}()
	require.Equal(t, "a", testwait.Recv(t, "the command in its handler", recs.loaded), "the command runs on the old set")

	// A reload swaps in a new set while the command is in its handler.
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	next, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	e.Swap(next)
	require.Same(t, next, e.Set())

	_, err = old.Modules()[0].Handle(context.Background(), "behave", nil, nil)
	require.NoError(t, err, "the old set stays open while a command runs on it")
	recs.release("a")
	require.NoError(t, testwait.Recv(t, "the command's result", done), "the old set was not closed under the running command")
	// Once its last call has left, the old set is closed.
	testwait.For(t, "the old set closed", func() (bool, string) {
		_, err := old.Modules()[0].Handle(context.Background(), "behave", nil, nil)
		return err != nil, "the old set's module still answers"
	})
	// New work runs on the new set.
	_, err = e.Dispatch(context.Background(), "Increment", json.RawMessage(`{"id":"x"}`), abi.Metadata{})
	require.NoError(t, err)
}

func TestFollowUpChainsAreBounded(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	res, err := e.Dispatch(ctx, "Again", json.RawMessage(`{"id":"x"}`), abi.Metadata{})
	require.NoError(t, err, "the first command commits")
	require.Len(t, res.Dispatched, 1)
	r, err := e.opts.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "again", ID: "x"})
	require.NoError(t, err)
	require.Equal(t, int64(MaxFollowUpDepth), r.Version, "the command and %d follow-ups committed; the next one's own follow-up was over the budget, so it failed whole", MaxFollowUpDepth-1)
}
