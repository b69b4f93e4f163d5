package engine

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/record"
)

// untilRecords answers the loads a spinning guest polls (aggregate
// slow/go for the Slow command's Until, aggregate ops/go for the
// "spin" op): not found until release, then found. It ignores the load's
// context on purpose: the guest must keep spinning after Stop cancels, as
// an uninterruptible guest in a loop of its own would. The first poll of
// each reports on spinning, so the test knows the guest is in its loop.
type untilRecords struct {
	record.Store
	spinning chan string
	once     sync.Map
	released chan struct{}
}

func (u *untilRecords) Load(ctx context.Context, k record.Key) (record.Record, error) {
	if k.ID != "go" {
		return u.Store.Load(ctx, k)
	}
	if _, seen := u.once.LoadOrStore(k.Type, true); !seen {
		u.spinning <- k.Type
	}
	select {
	case <-u.released:
		return record.Record{Key: k, Version: 1, Data: json.RawMessage(`{}`)}, nil
	default:
		return record.Record{Key: k}, nil
	}
}

// A stop whose deadline passes while a command and a delivery spin in an
// uninterruptible module returns anyway, reporting the abandoned work; the
// work, once it returns, commits nothing, and the engine then ends.
func TestStopReturnsAtItsDeadlineWhileUninterruptibleGuestsSpin(t *testing.T) {
	// The guests poll a load until released: more host calls than a
	// call's default budget.
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Uninterruptible: true, Timeout: time.Hour, MaxHostCalls: 1 << 30}),
		Instances: 2, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	set, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	mem := unitofwork.NewMemory()
	recs := &untilRecords{Store: mem.Records, spinning: make(chan string, 2), released: make(chan struct{})}
	e := New(set, Options{Events: mem.Events, Records: recs, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})})
	released := false
	release := func() {
		if !released {
			released = true
			close(recs.released)
		}
	}
	src, err := broker.NewInline(broker.DefaultOptions())
	require.NoError(t, err)
	// Cleanup order (last first): let the guests go, wait for the engine
	// to end, then close the broker and the loader after it.
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	t.Cleanup(func() { _ = src.Close() })
	t.Cleanup(func() {
		release()
		ended(t, e)
	})

	g := groups.New(groups.Options{Source: src, Handler: e.Handler(), Classify: Classify,
		Groups: func() []groups.Group { return routes.Of(e.Set(), false).Groups() }})
	require.NoError(t, g.Start(context.Background()))
	require.NoError(t, src.Publish(context.Background(), delivery.Message{ID: "op-1", Stream: "ops", Type: "Op",
		EventStream: "ops-d", Data: json.RawMessage(`{"op":"spin","id":"d","arg":"go"}`)}))
	dispatched := make(chan error, 1)
	go func() {
		_, err := e.Dispatch(context.Background(), "Slow", json.RawMessage(`{"id":"a","ms":0,"until":"go"}`), abi.Metadata{})
		dispatched <- err
	}()
	in := map[string]bool{}
	for range 2 {
		in[testwait.Recv(t, "a guest spinning", recs.spinning)] = true
	}
	require.Equal(t, map[string]bool{"slow": true, "ops": true}, in, "the command and the delivery both in their loops")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- stopAll(ctx, g, e) }()
	// Stop returns although neither guest can have returned: they leave
	// their loops only once released, below.
	err = testwait.Recv(t, "Stop to return while the guests spin", stopped)
	require.ErrorIs(t, err, ErrAbandoned)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	select {
	case err := <-dispatched:
		t.Fatalf("the command returned (%v) before its guest was released", err)
	case <-e.Done():
		t.Fatal("the engine reported it had ended with guests still spinning")
	default:
	}
	require.NoError(t, e.Stop(context.Background()), "a second Stop is a no-op")

	// Released, the command returns canceled and commits nothing: its
	// result was discarded.
	release()
	err = testwait.Recv(t, "the abandoned command to return", dispatched)
	require.ErrorIs(t, err, host.ErrCanceled)
	ended(t, e)
	evs, err := mem.Events.ReadStream(context.Background(), "slow-a", 0, 0)
	require.NoError(t, err)
	require.Empty(t, evs, "an abandoned command's effects were committed")
	_, err = m.Handle(context.Background(), "behave", nil, nil)
	require.Error(t, err, "the engine's set is closed once its last call has left")
}

// Swap after Stop closes the set it is given, and a command is refused.
func TestSwapAfterStop(t *testing.T) {
	e, _ := newEngine(t)
	require.NoError(t, e.Stop(context.Background()))
	ended(t, e)

	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	next, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	e.Swap(next)
	require.NotSame(t, next, e.Set())
	_, err = m.Handle(context.Background(), "behave", nil, nil)
	require.Error(t, err, "a set swapped in after Stop is closed")
	_, err = e.Dispatch(context.Background(), "Increment", json.RawMessage(`{"id":"x"}`), abi.Metadata{})
	require.True(t, errors.Is(err, ErrStopped), "%v", err)
}

// ended waits for the engine to report it has ended.
func ended(t *testing.T, e *Engine) {
	t.Helper()
	testwait.For(t, "the engine to end", func() (bool, string) {
		select {
		case <-e.Done():
			return true, ""
		default:
			return false, "Done() still open"
		}
	})
}
