package host

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// fakeClock drives the reaper: its time moves only when the test moves
// it, and a sweep runs only when the test fires the reaper's wait.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
	// waits carries each wait the reaper starts (one at a time: it
	// starts the next after the sweep the last one fired).
	waits   chan chan time.Time
	pending chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), waits: make(chan chan time.Time, 1)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.waits <- ch
	return ch
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) wait(t testing.TB) chan time.Time {
	t.Helper()
	select {
	case ch := <-c.waits:
		return ch
	case <-time.After(testwait.Limit()):
		t.Fatal("the reaper never waited on the clock")
		return nil
	}
}

// sweep fires the reaper's wait and returns once the sweep is over: the
// reaper has started its next wait.
func (c *fakeClock) sweep(t testing.TB) {
	t.Helper()
	if c.pending == nil {
		c.pending = c.wait(t)
	}
	c.pending <- c.Now()
	c.pending = c.wait(t)
}

var okBatch = []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op": "ok", "id": "d"}`)}}

// idleModule loads the behave module with up to 3 instances, each closed
// after a minute idle by clk.
func idleModule(t *testing.T, clk *fakeClock) (*Module, *Loader) {
	t.Helper()
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, InstanceIdle: time.Minute},
		Instances: 3, Clock: clk, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		_ = l.Close(context.Background())
	})
	return m, l
}

func call(t *testing.T, m *Module) {
	t.Helper()
	res, err := m.Handle(context.Background(), "behave", okBatch, nopSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Nil(t, res[0].Error)
}

// hold makes n instances and puts them all back idle, as a burst of n
// concurrent calls leaves them.
func hold(t *testing.T, m *Module, n int) {
	t.Helper()
	var held []*instance
	for range n {
		inst, err := m.acquire(context.Background(), context.Background())
		require.NoError(t, err)
		held = append(held, inst)
	}
	for _, inst := range held {
		m.recycle(context.Background(), inst)
	}
}

// Instances idle past InstanceIdle are closed and counted as "idle"; the
// next call makes one and succeeds.
func TestIdleInstancesAreClosed(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, _ := idleModule(t, clk)
	hold(t, m, 3)
	st := m.Instances()
	require.Equal(t, 3, st.Live)
	require.Equal(t, 3, st.Idle)

	clk.advance(time.Minute - time.Millisecond)
	clk.sweep(t)
	require.Equal(t, 3, m.Instances().Live, "not idle long enough yet")

	clk.advance(time.Millisecond)
	clk.sweep(t)
	st = m.Instances()
	require.Equal(t, 0, st.Live)
	require.Equal(t, 0, st.Idle)
	require.Equal(t, int64(3), st.Discarded["idle"])
	require.Equal(t, int64(3), st.Created)

	call(t, m)
	st = m.Instances()
	require.Equal(t, 1, st.Live)
	require.Equal(t, int64(4), st.Created)
}

// The idle instances are a stack: calls one at a time keep taking the
// most recently used, so the others age out while it stays. (A queue
// would hand each in turn to the next call, and none would ever age.)
func TestHotInstanceStaysWhileTheOthersAgeOut(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, _ := idleModule(t, clk)
	hold(t, m, 3)
	for range 7 {
		clk.advance(10 * time.Second)
		call(t, m)
		clk.sweep(t)
	}
	st := m.Instances()
	require.Equal(t, 1, st.Live, "the instance in use stays")
	require.Equal(t, int64(2), st.Discarded["idle"], "the other two aged out")
	require.Equal(t, int64(3), st.Created, "the calls never made another")
}

// Calls racing the reaper never get an instance it closes: every call
// succeeds while instances are reaped under them.
func TestCallsRacingTheReaper(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, _ := idleModule(t, clk)
	sweeps := raceTheReaper(t, clk, m, 8, time.Minute)
	st := m.Instances()
	require.Positive(t, st.Discarded["idle"], "after %d sweeps", sweeps)
	require.Equal(t, int64(0), st.Discarded["failed"])
	require.Equal(t, 0, st.Live, "the last sweep closed every instance the calls left")
}

// The reaper's goroutine runs while a module with an InstanceIdle is
// loaded, and stops with the last one's Close or the Loader's.
func TestReaperStopsWithItsModulesAndLoader(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, InstanceIdle: time.Minute},
		CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	path := wasmbuild.Build(t, "./internal/host/testdata/plugins/behave")
	running := func() bool {
		l.reaper.mu.Lock()
		defer l.reaper.mu.Unlock()
		return l.reaper.stop != nil
	}
	a, err := l.LoadFile(context.Background(), path)
	require.NoError(t, err)
	b, err := l.LoadFile(context.Background(), path)
	require.NoError(t, err)
	require.True(t, running())
	require.NoError(t, a.Close(context.Background()))
	require.True(t, running(), "b is still loaded")
	require.NoError(t, b.Close(context.Background()))
	require.False(t, running())

	c, err := l.LoadFile(context.Background(), path)
	require.NoError(t, err)
	require.True(t, running())
	require.NoError(t, l.Close(context.Background()))
	require.False(t, running(), "c is loaded, but its loader closed")
	require.NoError(t, c.Close(context.Background()))
}

// raceTheReaper makes calls calls of m on each of 3 goroutines while it
// advances clk by step and sweeps, until the calls are done; every call
// must succeed. It returns the sweeps made.
func raceTheReaper(t *testing.T, clk *fakeClock, m *Module, calls int, step time.Duration) (sweeps int) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for range calls {
				if _, err := m.Handle(context.Background(), "behave", okBatch, nopSession{}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	for running := true; running; sweeps++ {
		select {
		case <-done:
			running = false
		default:
		}
		clk.advance(step)
		clk.sweep(t)
	}
	return sweeps
}
