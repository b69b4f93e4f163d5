package host_test

import (
	"context"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// Each tenant's use of the host sums its modules' (Module.Usage) beside
// its share: calls and guest time, instances, the memory of its live
// instances (a busy one's too: tenant a's instance is in a call when it is
// read) and its compiled code, 0 once the module is closed.
func TestTenantsSumTheirModulesUse(t *testing.T) {
	ctx := context.Background()
	tenants := map[string]string{"holder": "a", "grower": "b"}
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), GuestConcurrency: 4, CacheDir: wasmbuild.CacheDir(t),
		Tenancy: host.Tenancy{Of: func(m string) string { return tenants[m] }}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	src := wasmbuild.Build(t, "./internal/host/testdata/plugins/behave")
	dir := t.TempDir()
	load := func(name string) *host.Module {
		m, err := l.LoadFile(ctx, wasmbuild.Copy(t, src, dir, name+".wasm"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close(ctx) })
		return m
	}
	holder, grower := load("holder"), load("grower")
	fi, err := os.Stat(src)
	require.NoError(t, err)

	_, err = grower.Handle(ctx, "behave", op("grow", "8"), &memSession{})
	require.NoError(t, err)
	u := grower.Usage()
	require.Equal(t, int64(1), u.Calls)
	require.Positive(t, u.GuestSeconds)
	require.GreaterOrEqual(t, u.GuestMemoryBytes, uint64(8<<20), "the 8 MiB the guest holds")
	require.Equal(t, 4*fi.Size(), u.CodeBytes)

	s := &blockingSession{entered: make(chan struct{}, 1), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := holder.Handle(ctx, "behave", ops("load"), s)
		done <- err
	}()
	testwait.Recv(t, "the holder's call in its host function", s.entered)
	ts := host.Tenants([]*host.Module{grower, holder}, l.Scheduler())
	require.Len(t, ts, 2)
	a, b := ts[0], ts[1]
	require.Equal(t, "a", a.Tenant)
	require.Equal(t, []string{"holder.wasm"}, a.Modules)
	require.Equal(t, 1, a.Live)
	require.Zero(t, a.Idle, "its instance is in the call")
	require.Positive(t, a.GuestMemoryBytes, "a busy instance's memory counts")
	require.NotNil(t, a.Share)
	require.Equal(t, 1, a.Share.Running)
	require.Equal(t, "b", b.Tenant)
	require.Equal(t, 1, b.Live)
	require.Equal(t, 1, b.Idle)
	require.Equal(t, u.GuestMemoryBytes, b.GuestMemoryBytes)
	require.Equal(t, int64(1), b.Calls)
	require.Equal(t, b.Share.GuestSeconds, b.GuestSeconds, "the share's guest time")
	require.Positive(t, b.GuestSeconds)
	close(s.release)
	require.NoError(t, testwait.Recv(t, "the holder's call to end", done))

	a = host.Tenants([]*host.Module{holder}, l.Scheduler())[0]
	require.Equal(t, int64(1), a.Calls)
	require.Positive(t, a.GuestSeconds)
	require.Equal(t, 0, a.Live-a.Idle, "back in the pool")

	require.NoError(t, grower.Close(ctx))
	u = grower.Usage()
	require.Zero(t, u.GuestMemoryBytes, "a closed module's instances hold nothing")
	require.Zero(t, u.CodeBytes)
}

// The compiled-code estimate (the file's size x 4) stays within 2x of
// the compiled code wazero writes to its file cache for a Go guest: the
// measure the factor was taken from. A change of wazero's compiler, or of
// the instrumentation, that moves it further fails here.
func TestCodeEstimateTracksTheCompiledCache(t *testing.T) {
	ctx := context.Background()
	cache := t.TempDir()
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: cache})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	size := func() int64 {
		var n int64
		require.NoError(t, filepath.WalkDir(cache, func(_ string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			fi, err := d.Info()
			n += fi.Size()
			return err
		}))
		return n
	}
	kernel := size() // the Extism kernel, compiled by NewLoader
	m, err := l.LoadFile(ctx, wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), t.TempDir(), "behave.wasm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(ctx) })
	compiled := size() - kernel
	est := m.Usage().CodeBytes
	require.Positive(t, compiled)
	ratio := float64(est) / float64(compiled)
	require.True(t, ratio >= 0.5 && ratio <= 2, "estimate %d, compiled %d", est, compiled)
}

// WaitQuantile is the bound of the histogram bucket that holds the
// quantile.
func TestWaitQuantile(t *testing.T) {
	n := len(host.WaitBuckets)
	for _, c := range []struct {
		name  string
		waits map[int]int64 // bucket -> calls
		q     float64
		want  float64
	}{
		{"no call", nil, 0.95, 0},
		{"all fast", map[int]int64{0: 10}, 0.95, 0.001},
		{"the 95th in the second bucket", map[int]int64{0: 94, 1: 6}, 0.95, 0.005},
		{"the median in the first", map[int]int64{0: 94, 1: 6}, 0.5, 0.001},
		{"past the last bound", map[int]int64{0: 1, n: 99}, 0.95, math.Inf(1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var st host.ShareStats
			for i, k := range c.waits {
				st.Waits[i] = k
			}
			require.Equal(t, c.want, st.WaitQuantile(c.q))
		})
	}
}
