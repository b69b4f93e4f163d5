package host_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// cacheFiles lists the compiled-code files of a cache directory (relative
// names) and their total size.
func cacheFiles(t *testing.T, dir string) ([]string, int64) {
	t.Helper()
	var names []string
	var total int64
	dirs, err := filepath.Glob(filepath.Join(dir, "wazero-*"))
	require.NoError(t, err)
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, e := range entries {
			info, err := e.Info()
			require.NoError(t, err)
			names = append(names, filepath.Join(filepath.Base(d), e.Name()))
			total += info.Size()
		}
	}
	slices.Sort(names)
	return names, total
}

// memoCount counts the manifest memos in the cache directory dir.
func memoCount(t *testing.T, dir string) int {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "protean-manifests", "*.json"))
	require.NoError(t, err)
	return len(names)
}

// boundedLoader is a loader on the cache directory dir, bounded to max
// bytes.
func boundedLoader(t *testing.T, dir string, max int64) *host.Loader {
	t.Helper()
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: dir, CacheMaxBytes: max})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// The compiled-code cache directory stays within cache_max_mb as module
// versions come and go: after each compile that wrote to it, the least
// recently used versions no module loads are deleted; the loaded ones,
// the one just compiled and the Extism kernel stay, so a restart on the
// current versions compiles nothing (no file is written), and only a
// pruned version is compiled again.
func TestCacheDirStaysWithinItsBound(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	version := func(n int) string {
		return wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", fmt.Sprintf("version=0.0.%d", n))
	}

	// The kernel alone, then one version: what one version costs.
	l := boundedLoader(t, dir, 1<<40)
	kernel, kernelSize := cacheFiles(t, dir)
	require.NotEmpty(t, kernel, "NewLoader compiled the Extism kernel into the cache")
	m1, err := l.LoadFile(ctx, version(1))
	require.NoError(t, err)
	files, size := cacheFiles(t, dir)
	require.Len(t, files, len(kernel)+1, "one version is one file")
	require.Equal(t, 1, memoCount(t, dir), "and one manifest memo")
	one := size - kernelSize
	require.NoError(t, m1.Close(ctx))
	require.NoError(t, l.Close(ctx))

	// Bounded to the kernel and two versions: loading versions 2..5, each
	// closed once the next is loaded (a reload), keeps the directory
	// within the bound, and holds the loaded one and the newest.
	bound := kernelSize + 2*one + one/2
	l = boundedLoader(t, dir, bound)
	var loaded *host.Module
	for n := 2; n <= 5; n++ {
		m, err := l.LoadFile(ctx, version(n))
		require.NoError(t, err, "version %d", n)
		if loaded != nil {
			require.NoError(t, loaded.Close(ctx))
		}
		loaded = m
		files, size := cacheFiles(t, dir)
		require.LessOrEqual(t, size, bound, "after version %d: %v", n, files)
		require.Subset(t, files, kernel, "after version %d, the kernel is kept", n)
		require.Equal(t, len(files)-len(kernel), memoCount(t, dir), "after version %d, a pruned version's memo goes with it", n)
	}

	// A bound smaller than what is loaded: the loaded modules are kept
	// anyway, what is not loaded goes.
	require.NoError(t, l.Close(ctx))
	l = boundedLoader(t, dir, 1)
	m5, err := l.LoadFile(ctx, version(5))
	require.NoError(t, err)
	m6, err := l.LoadFile(ctx, version(6))
	require.NoError(t, err)
	m7, err := l.LoadFile(ctx, version(7))
	require.NoError(t, err)
	files, _ = cacheFiles(t, dir)
	require.Len(t, files, len(kernel)+3, "versions 5, 6 and 7 are loaded, version 4 is pruned: %v", files)
	require.Equal(t, 3, memoCount(t, dir))
	require.Subset(t, files, kernel)
	current := slices.Clone(files)

	// A restart on the loaded versions writes nothing: every one is a hit.
	for _, m := range []*host.Module{m5, m6, m7} {
		require.NoError(t, m.Close(ctx))
	}
	require.NoError(t, l.Close(ctx))
	l = boundedLoader(t, dir, 1)
	for n := 5; n <= 7; n++ {
		m, err := l.LoadFile(ctx, version(n))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close(ctx) })
		files, _ := cacheFiles(t, dir)
		require.Equal(t, current, files, "a restart on version %d compiles nothing", n)
	}
	// A pruned version is compiled again.
	m2, err := l.LoadFile(ctx, version(2))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m2.Close(ctx) })
	files, _ = cacheFiles(t, dir)
	require.Len(t, files, len(current)+1, "version 2 was pruned and is compiled again")
}
