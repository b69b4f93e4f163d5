package host

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// sameBytes writes the C client_orders example under each of names into
// a new directory.
func sameBytes(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), dir, n+".wasm")
	}
	return dir
}

// sharedLoader is a loader over a cache of its own whose module "other"
// has memory limit otherMB (0: the same as the others).
func sharedLoader(t *testing.T, otherMB int) *Loader {
	t.Helper()
	w := testwait.Limit()
	lim := Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w}
	opts := LoaderOptions{Limits: lim, CacheDir: t.TempDir(), GuestConcurrency: -1}
	if otherMB > 0 {
		opts.TenantLimits = func(m string) Limits {
			if m == "other" {
				l := lim
				l.MemoryMB = otherMB
				return l
			}
			return lim
		}
	}
	l, err := NewLoader(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// Modules with the same bytes under the same limits compile once, loaded
// one after another or at once, and each serves from the one compile; the
// code closes with the last of them.
func TestModulesWithTheSameBytesShareTheirCode(t *testing.T) {
	t.Parallel()
	dir := sameBytes(t, "a", "b", "c")
	l := sharedLoader(t, 0)
	a, err := l.LoadFile(context.Background(), filepath.Join(dir, "a.wasm"))
	require.NoError(t, err)
	b, err := l.LoadFile(context.Background(), filepath.Join(dir, "b.wasm"))
	require.NoError(t, err)
	require.Equal(t, int64(1), l.compiles.Load(), "the second load shares the first's code")
	handleC(t, a)
	handleC(t, b)
	require.NoError(t, a.Close(context.Background()))
	handleC(t, b) // a's close left b's code open
	require.Len(t, l.shared, 1)
	require.NoError(t, b.Close(context.Background()))
	require.Empty(t, l.shared, "closed with its last holder")

	// At once: one compiles, the others wait for it.
	l2 := sharedLoader(t, 0)
	mods, errs := l2.LoadDir(context.Background(), dir)
	require.Empty(t, errs)
	require.Len(t, mods, 3)
	require.Equal(t, int64(1), l2.compiles.Load())
	for _, m := range mods {
		handleC(t, m)
		require.NoError(t, m.Close(context.Background()))
	}
	require.Empty(t, l2.shared)
}

// A module whose limits build another runtime (its memory limit) compiles
// its own.
func TestModulesUnderOtherLimitsDoNotShareCode(t *testing.T) {
	t.Parallel()
	dir := sameBytes(t, "one", "other")
	l := sharedLoader(t, 96)
	mods, errs := l.LoadDir(context.Background(), dir)
	require.Empty(t, errs)
	require.Equal(t, int64(2), l.compiles.Load())
	for _, m := range mods {
		handleC(t, m)
		require.NoError(t, m.Close(context.Background()))
	}
	require.Empty(t, l.shared)
}
