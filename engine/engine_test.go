package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/record"
	"github.com/proteanhq/protean-host/unitofwork"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// signalingRecords reports each load of an aggregate of type "slow".
type signalingRecords struct {
	record.Store
	loaded chan string
}

func (s *signalingRecords) Load(ctx context.Context, k record.Key) (record.Record, error) {
	if k.Type == "slow" {
		s.loaded <- k.ID
	}
	return s.Store.Load(ctx, k)
}

func newEngine(t *testing.T, limits ...host.Limits) (*Engine, *signalingRecords) {
	t.Helper()
	var lim host.Limits
	if len(limits) > 0 {
		lim = limits[0]
	}
	l, err := host.NewLoader(host.LoaderOptions{Limits: lim, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./host/testdata/plugins/behave"))
	require.NoError(t, err)
	set, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	t.Cleanup(func() { _ = set.Close(context.Background()) })
	mem := unitofwork.NewMemory()
	recs := &signalingRecords{Store: mem.Records, loaded: make(chan string, 16)}
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
	done := make(chan out, 1)
	go func() {
		res, err := e.Dispatch(ctx, "Slow", json.RawMessage(`{"id":"a","ms":300}`), abi.Metadata{})
		done <- out{res, err}
	}()
	require.Equal(t, "a", <-recs.loaded, "the command is in its handler")

	stopped := make(chan error, 1)
	go func() { stopped <- e.Stop(ctx) }()
	// New work is refused as soon as Stop begins…
	require.Eventually(t, func() bool { return errors.Is(e.Healthy(), ErrStopped) }, 10*time.Second, time.Millisecond)
	_, err := e.Dispatch(ctx, "Slow", json.RawMessage(`{"id":"b","ms":0}`), abi.Metadata{})
	require.ErrorIs(t, err, ErrStopped)
	// …while the command in flight finishes and commits.
	o := <-done
	require.NoError(t, o.err)
	require.Len(t, o.res.Events, 1)
	require.NoError(t, <-stopped)
	require.NoError(t, e.Stop(ctx), "a second Stop is a no-op")
}

func TestStopCancelsAtItsDeadline(t *testing.T) {
	e, recs := newEngine(t, host.Limits{Timeout: time.Second})
	done := make(chan error, 1)
	go func() {
		_, err := e.Dispatch(context.Background(), "Slow", json.RawMessage(`{"id":"a","ms":60000}`), abi.Metadata{})
		done <- err
	}()
	<-recs.loaded
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Stop does not cancel a command's own context; the module's deadline
	// (1 s here) ends the runaway call. Stop reports that the drain timed
	// out.
	require.ErrorIs(t, e.Stop(ctx), context.DeadlineExceeded)
	err := <-done
	require.ErrorIs(t, err, host.ErrTimeout)
}

func TestScopeIsolatesModules(t *testing.T) {
	e, _ := newEngine(t)
	l := e.loaded.Load()
	route := l.set.Subscribers("Op")[0]
	op := func(name string) abi.Envelope {
		return abi.Envelope{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"` + name + `","id":"x","arg":"order-x"}`)}
	}
	// Writing another module's projection fails the message permanently.
	res, err := e.call(context.Background(), l, route, []abi.Envelope{op("foreign")})
	require.NoError(t, err)
	require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind)
	require.Contains(t, res[0].Error.Message, "projection client_orders is not a projector or process manager of the module")
	// Loading an aggregate of a category the module does not declare is
	// refused by the host function.
	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("foreign_load")})
	require.NoError(t, err)
	require.Contains(t, res[0].Error.Message, "aggregate category order is not one the module declares messages on")
	// So is reading a stream of such a category.
	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("read")})
	require.NoError(t, err)
	require.Contains(t, res[0].Error.Message, "stream order-x is of category order")
}

func TestDispatchErrors(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	_, err := e.Dispatch(ctx, "Nope", json.RawMessage(`{}`), abi.Metadata{})
	require.ErrorIs(t, err, ErrUnknownCommand)
	_, err = e.Dispatch(ctx, "Increment", json.RawMessage(`[]`), abi.Metadata{})
	require.ErrorIs(t, err, ErrBadInput)
	_, _, err = e.Projection(ctx, "client_orders", "x")
	require.ErrorIs(t, err, ErrUnknownProjection)

	// Racing dispatches on one aggregate: every one either commits or
	// conflicts, and the commits are exactly the counter's value.
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"c"}`), abi.Metadata{})
			if err != nil {
				require.True(t, unitofwork.Conflict(err), "%v", err)
				return
			}
			mu.Lock()
			ok++
			mu.Unlock()
		}()
	}
	wg.Wait()
	r, err := e.opts.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "counter", ID: "c"})
	require.NoError(t, err)
	require.Equal(t, int64(ok), r.Version)
	require.JSONEq(t, `{"n":`+itoa(ok)+`}`, string(r.Data))
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestSwapRetiresTheOldSetAfterItsCalls(t *testing.T) {
	e, recs := newEngine(t)
	old := e.Set()
	done := make(chan error, 1)
	go func() {
		_, err := e.Dispatch(context.Background(), "Slow", json.RawMessage(`{"id":"a","ms":300}`), abi.Metadata{})
		done <- err
	}()
	require.Equal(t, "a", <-recs.loaded, "the command runs on the old set")

	// A reload swaps in a new set while the command is in its handler.
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./host/testdata/plugins/behave"))
	require.NoError(t, err)
	next, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	e.Swap(next)
	require.Same(t, next, e.Set())

	require.NoError(t, <-done, "the old set was not closed under the running command")
	// Once its last call has left, the old set is closed.
	require.Eventually(t, func() bool {
		_, err := old.Modules[0].Handle(context.Background(), "behave", nil, nil)
		return err != nil
	}, 10*time.Second, 5*time.Millisecond)
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
	require.Equal(t, int64(MaxFollowUpDepth+1), r.Version, "the command and %d follow-ups ran, then the chain was cut", MaxFollowUpDepth)
}
