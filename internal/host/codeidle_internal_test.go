package host

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// codeModule loads the behave module with up to 3 instances, each closed
// after a minute idle, and its code released after two minutes without a
// call, by clk; cacheDir "" keeps the compiled code in memory only.
func codeModule(t *testing.T, clk *fakeClock, cacheDir string) (*Module, *Loader) {
	t.Helper()
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, InstanceIdle: time.Minute,
		CodeIdle: 2 * time.Minute}, Instances: 3, Clock: clk, CacheDir: cacheDir,
		// The calls here wait for a compile holding their guest slot; a
		// tenant's cap of slots (half of 2 x GOMAXPROCS) would keep the
		// third from reaching it. Sharing is fairshare_test's.
		GuestConcurrency: -1})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		_ = l.Close(context.Background())
	})
	return m, l
}

func handleOK(t *testing.T, m *Module) []abi.Result {
	t.Helper()
	res, err := m.Handle(context.Background(), "behave", okBatch, nopSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Nil(t, res[0].Error)
	return res
}

// idleOut moves clk past the instances' idle limit, then the code's, a
// sweep each.
func idleOut(t *testing.T, clk *fakeClock) {
	t.Helper()
	clk.advance(time.Minute)
	clk.sweep(t)
	clk.advance(time.Minute)
	clk.sweep(t)
}

// gate makes m's next compiles of released code wait for open, counting
// them in entered and signalling each on began (the test calls it while
// the reaper waits on the clock).
func gate(m *Module) (entered *atomic.Int32, began chan struct{}, open chan struct{}) {
	entered, began, open = new(atomic.Int32), make(chan struct{}, 8), make(chan struct{})
	recompile := m.recompile
	m.recompile = func(ctx context.Context) (*compiledCode, error) {
		entered.Add(1)
		began <- struct{}{}
		<-open
		return recompile(ctx)
	}
	return entered, began, open
}

// A module with no instance and no call for CodeIdle gives back its code;
// the next call compiles it again and answers as before.
func TestIdleCodeIsReleasedAndComesBack(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, l := codeModule(t, clk, wasmbuild.CacheDir(t))
	before := handleOK(t, m)

	clk.advance(time.Minute)
	clk.sweep(t)
	st := m.Instances()
	require.Equal(t, 0, st.Live, "the instance was reclaimed")
	require.True(t, st.CodeLoaded, "a minute without a call: the code stays")

	clk.advance(time.Minute - time.Millisecond)
	clk.sweep(t)
	require.True(t, m.Instances().CodeLoaded, "not idle long enough yet")
	clk.advance(time.Millisecond)
	clk.sweep(t)
	st = m.Instances()
	require.False(t, st.CodeLoaded)
	require.Equal(t, int64(1), st.CodeReleased)
	require.Equal(t, int64(0), st.CodeLoads)

	compiles := l.compiles.Load()
	require.Equal(t, before, handleOK(t, m))
	st = m.Instances()
	require.True(t, st.CodeLoaded)
	require.Equal(t, int64(1), st.CodeLoads)
	require.Equal(t, compiles+1, l.compiles.Load())
}

// Calls that find the code released share one compile.
func TestConcurrentCallsAfterAReleaseCompileOnce(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, l := codeModule(t, clk, wasmbuild.CacheDir(t))
	idleOut(t, clk)
	require.False(t, m.Instances().CodeLoaded)
	entered, _, open := gate(m)
	compiles := l.compiles.Load()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { handleOK(t, m) })
	}
	testwait.For(t, "three calls waiting for the code", func() (bool, string) {
		return len(m.pool.sem) == 3 && entered.Load() >= 1, fmt.Sprintf("%d calls, %d compiles", len(m.pool.sem), entered.Load())
	})
	close(open)
	wg.Wait()
	require.Equal(t, int32(1), entered.Load())
	require.Equal(t, compiles+1, l.compiles.Load())
	require.Equal(t, int64(1), m.Instances().CodeLoads)
}

// A call whose deadline ends while the released code compiles fails with
// ErrTimeout; the compile goes on, and the next call uses it.
func TestCompileOverTheCallDeadlineServesTheNext(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, l := codeModule(t, clk, wasmbuild.CacheDir(t))
	idleOut(t, clk)
	entered, began, open := gate(m)
	callCtx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-began:
		case <-time.After(testwait.Limit()):
		}
		cancel() // the call's deadline, not the caller's cancellation
	}()
	_, err := m.acquire(callCtx, context.Background())
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, ErrNotReady)
	require.ErrorContains(t, err, "its code is still compiling")
	compiles := l.compiles.Load()
	close(open)
	testwait.For(t, "the compile ended", func() (bool, string) {
		st := m.Instances()
		return st.CodeLoaded, fmt.Sprintf("%+v", st)
	})
	handleOK(t, m)
	require.Equal(t, int32(1), entered.Load())
	require.Equal(t, compiles+1, l.compiles.Load())
	require.Equal(t, 0, len(m.pool.sem), "the failed call gave its slot back")
}

// Calls racing releases never use closed code: every call succeeds while
// the reaper releases the code between them (run with -race).
func TestCallsRacingTheCodeRelease(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, _ := codeModule(t, clk, wasmbuild.CacheDir(t))
	raceTheReaper(t, clk, m, 4, 2*time.Minute)
	st := m.Instances()
	require.Positive(t, st.CodeReleased)
	require.False(t, st.CodeLoaded, "the last sweep released the code the calls left")
	require.Equal(t, st.CodeReleased-1, st.CodeLoads, "each release but the last was followed by one compile")
	require.Equal(t, int64(0), st.Discarded["failed"])
}

// Without a cache directory the code is never released: compiling it
// again would be a cold compile.
func TestNoCacheDirKeepsTheCode(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	m, _ := codeModule(t, clk, "")
	handleOK(t, m)
	idleOut(t, clk)
	clk.advance(time.Hour)
	clk.sweep(t)
	st := m.Instances()
	require.Equal(t, 0, st.Live, "the instances were reclaimed")
	require.True(t, st.CodeLoaded)
	require.Equal(t, int64(0), st.CodeReleased)
}
