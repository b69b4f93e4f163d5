package host

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// memoLoad loads a plugins directory of the C client_orders example (it
// compiles in milliseconds, a Go guest in seconds, minutes under -race,
// and every test here starts on a cold cache) on a new loader over the
// cache directory dir, with lim (its timeouts the test's wait limit), and
// returns the module with its loader.
func memoLoad(t *testing.T, dir string, lim Limits) (*Module, *Loader) {
	t.Helper()
	w := testwait.Limit()
	lim.Timeout, lim.ManifestTimeout, lim.CompileTimeout = w, w, w
	l, err := NewLoader(LoaderOptions{Limits: lim, CacheDir: dir, GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	plugins := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), plugins, "client_orders.wasm")
	mods, errs := l.LoadDir(context.Background(), plugins)
	require.Empty(t, errs)
	require.Len(t, mods, 1)
	m := mods[0]
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		_ = l.Close(context.Background())
	})
	return m, l
}

// handleC makes one call of the client_orders module m.
func handleC(t *testing.T, m *Module) {
	t.Helper()
	res, err := m.Handle(context.Background(), "client_orders", orderPlaced, orderSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Nil(t, res[0].Error)
}

// memos lists the manifest memos of the cache directory dir.
func memos(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, memoDir, "*.json"))
	require.NoError(t, err)
	return names
}

// A load that finds the memo of the same file under the same limits
// compiles nothing: its manifest comes from the memo, and its first call
// compiles the code, once.
func TestAMemoizedModuleCompilesAtItsFirstCall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// code_idle_ms on: no warm-up, so what compiles is the call.
	lim := Limits{CodeIdle: time.Hour}
	first, l1 := memoLoad(t, dir, lim)
	require.Equal(t, int64(1), l1.compiles.Load(), "for the interpreter")
	require.False(t, first.fromMemo)
	require.Len(t, memos(t, dir), 1, "the load wrote its memo")

	m, l := memoLoad(t, dir, lim)
	require.Zero(t, l.compiles.Load(), "a memoized load compiled")
	require.False(t, m.Instances().CodeLoaded)
	require.False(t, m.Warming(), "code_idle_ms releases idle code: no warm-up")
	require.Equal(t, first.Manifest, m.Manifest)
	require.Equal(t, first.Deadline, m.Deadline)
	require.Equal(t, first.hasStart, m.hasStart)

	handleC(t, m)
	handleC(t, m)
	require.Equal(t, int64(1), l.compiles.Load())
	st := m.Instances()
	require.True(t, st.CodeLoaded)
	require.Equal(t, int64(1), st.CodeLoads)
}

// Without code_idle_ms, a memoized module's code is compiled in the
// background at once, and the module is Warming until it is.
func TestAMemoizedModuleWarmsUpWithoutCodeIdle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{})
	m, l := memoLoad(t, dir, Limits{})
	testwait.True(t, "the warm-up compiled the code", func() bool { return !m.Warming() && m.Instances().CodeLoaded })
	require.Equal(t, int64(1), l.compiles.Load())
	require.Nil(t, m.recompile, "code never released keeps nothing to compile it again")
	handleC(t, m)
	require.Equal(t, int64(1), l.compiles.Load())
}

// A start leaves the packing of what a module keeps to compile its
// released code again until after the set is loaded; the packed bytes
// compile it. Code never released keeps nothing (above).
func TestAStartPacksTheSourcesAfterItsLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file, err := os.ReadFile(wasmbuild.BuildC(t, "plugins/c/client_orders.c"))
	require.NoError(t, err)
	m, l := memoLoad(t, dir, Limits{CodeIdle: time.Hour})
	l.warmups.Wait()
	require.NotNil(t, m.source)
	m.source.mu.Lock()
	raw, packed := m.source.raw, m.source.packed
	m.source.mu.Unlock()
	require.Nil(t, raw, "packed after the load")
	require.NotEmpty(t, packed)
	require.Less(t, len(packed), len(file))
	b, err := m.source.bytes()
	require.NoError(t, err)
	require.Equal(t, file, b, "unpacked, the file's bytes")
	handleC(t, m)
	require.True(t, m.Instances().CodeLoaded)
}

// LoadFile loads a module compiled, memo or not.
func TestLoadFileCompiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{})
	l, err := NewLoader(LoaderOptions{CacheDir: dir, GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.BuildC(t, "plugins/c/client_orders.c"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	require.True(t, m.Instances().CodeLoaded)
	require.False(t, m.Warming())
}

// A memo is the same file's under the same limits only: another memory
// limit loads the module in full, and writes a memo of its own.
func TestAMemoIsKeyedByTheLimits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{MemoryMB: 64})
	m, l := memoLoad(t, dir, Limits{MemoryMB: 48})
	require.Positive(t, l.compiles.Load())
	require.False(t, m.fromMemo)
	require.Len(t, memos(t, dir), 2)
}

// A memo that does not read as one is passed over: the module loads in
// full, and its memo is written again.
func TestAnUnusableMemoLoadsTheModuleInFull(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{})
	names := memos(t, dir)
	require.Len(t, names, 1)
	good, err := os.ReadFile(names[0])
	require.NoError(t, err)
	for _, bad := range []string{"{", `{"manifest":"","key":"k"}`, `{"manifest":"bm90IGEgbWFuaWZlc3Q=","key":"k"}`} {
		require.NoError(t, os.WriteFile(names[0], []byte(bad), 0o644))
		m, l := memoLoad(t, dir, Limits{})
		require.Positive(t, l.compiles.Load(), bad)
		handleC(t, m)
		again, err := os.ReadFile(names[0])
		require.NoError(t, err)
		require.JSONEq(t, string(good), string(again), "the memo was written again")
	}
}

// slotlessLoad is memoLoad on a loader whose warm-up slots are all taken
// (freeSlots gives them back): its warm-ups wait.
func slotlessLoad(t *testing.T, dir string) (*Module, *Loader) {
	t.Helper()
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w}, CacheDir: dir, GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	for range cap(l.warmSlots) {
		l.warmSlots <- struct{}{}
	}
	plugins := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), plugins, "client_orders.wasm")
	mods, errs := l.LoadDir(context.Background(), plugins)
	require.Empty(t, errs)
	t.Cleanup(func() { _ = mods[0].Close(context.Background()) })
	return mods[0], l
}

func freeSlots(l *Loader) {
	for range cap(l.warmSlots) {
		<-l.warmSlots
	}
}

// A call never waits for a warm-up: with every warm-up slot taken, a
// memoized module stays Warming, a call compiles its code, and the
// warm-up that comes after finds it compiled.
func TestACallDoesNotWaitForTheWarmUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{})
	m, l := slotlessLoad(t, dir)
	set, problems := NewSet([]*Module{m}, Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	require.True(t, m.fromMemo)
	require.True(t, m.Warming())
	require.Equal(t, 1, set.Warming())

	handleC(t, m)
	require.True(t, m.Warming(), "the warm-up still waits for a slot")
	freeSlots(l)
	testwait.True(t, "the warm-up ended", func() bool { return set.Warming() == 0 })
	require.Equal(t, int64(1), l.compiles.Load(), "the warm-up found the code compiled")
	require.Equal(t, int64(1), m.Instances().CodeLoads)
}

// A start with no memo reads each manifest on wazero's interpreter and
// compiles the code after (a warm-up, or the first call); a reload
// compiles a new version before it goes live.
func TestAStartReadsManifestsOnTheInterpreter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m, l := memoLoad(t, dir, Limits{CodeIdle: time.Hour})
	require.Equal(t, int64(1), l.compiles.Load(), "the interpreter's compile")
	require.False(t, m.Instances().CodeLoaded)
	require.False(t, m.fromMemo)
	require.NotEmpty(t, m.memo)
	handleC(t, m)
	require.Equal(t, int64(2), l.compiles.Load(), "and the call's")
	require.True(t, m.Instances().CodeLoaded)

	// Other limits: the memo written above is not this load's.
	plugins := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), plugins, "client_orders.wasm")
	lim := m.Limits
	lim.MemoryMB = 48
	r, err := NewLoader(LoaderOptions{Limits: lim, CacheDir: dir, GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	mods, errs := r.loadDir(context.Background(), plugins, &Set{})
	require.Empty(t, errs)
	t.Cleanup(func() { _ = mods[0].Close(context.Background()) })
	require.True(t, mods[0].Instances().CodeLoaded, "a reload compiled the new version")
	require.Empty(t, mods[0].memo)
}

// A warm-up whose compile fails logs it, leaves the module's calls to
// fail, and deletes its memo, so that the next start compiles it first.
func TestAFailedWarmUpDeletesTheMemo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memoLoad(t, dir, Limits{})
	require.Len(t, memos(t, dir), 1)
	m, l := slotlessLoad(t, dir)
	require.True(t, m.fromMemo)
	m.recompile = func(context.Context) (*compiledCode, error) { return nil, ErrCompileTimeout }
	freeSlots(l)
	testwait.True(t, "the warm-up ended", func() bool { return !m.Warming() })
	require.Empty(t, memos(t, dir))
	_, err := m.Handle(context.Background(), "client_orders", orderPlaced, orderSession{})
	require.ErrorIs(t, err, ErrCompileTimeout)
}
