package host_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// loadDir is LoadDir on its own goroutine: a load that blocks (the open
// of a named pipe did, for ever) fails the test with a diagnosis instead
// of hanging it.
func loadDir(t *testing.T, l *host.Loader, dir string) ([]*host.Module, []error) {
	t.Helper()
	type result struct {
		mods []*host.Module
		errs []error
	}
	done := make(chan result, 1)
	go func() {
		mods, errs := l.LoadDir(context.Background(), dir)
		done <- result{mods, errs}
	}()
	r := testwait.Recv(t, "LoadDir "+dir+" to return", done)
	for _, m := range r.mods {
		t.Cleanup(func() { _ = m.Close(context.Background()) })
	}
	return r.mods, r.errs
}

// newLoader is a loader of its own (its compile count is this test's)
// logging to logs.
func newLoader(t *testing.T, opts host.LoaderOptions, logs *testlog.Buffer) *host.Loader {
	t.Helper()
	opts.Limits = generous(opts.Limits)
	opts.CacheDir = wasmbuild.CacheDir(t)
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	l, err := host.NewLoader(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// requireRefused checks errs is one *LoadError naming file, caused by
// cause, saying want.
func requireRefused(t *testing.T, errs []error, file string, cause error, want string) {
	t.Helper()
	require.Len(t, errs, 1, "%v", errs)
	var le *host.LoadError
	require.ErrorAs(t, errs[0], &le)
	require.Equal(t, file, le.File)
	require.ErrorIs(t, errs[0], cause)
	require.Contains(t, errs[0].Error(), file+": "+want)
}

// Only regular files are read from a plugins directory: a named pipe (whose
// open blocked a reload for ever), a device (a link to /dev/urandom ran a
// host out of memory), a socket, a directory, or a link out of the
// directory (one to /etc/shadow was read) named *.wasm is refused at once,
// by name, without a compile.
func TestPluginFilesOnlyRegular(t *testing.T) {
	outside := t.TempDir()
	good := wasmbuild.Copy(t, declared(t, "projector"), outside, "projector.wasm")
	tests := []struct {
		name  string
		make  func(t *testing.T, path string)
		cause error
		want  string
	}{
		{"named pipe", func(t *testing.T, path string) { require.NoError(t, syscall.Mkfifo(path, 0o644)) },
			host.ErrNotRegular, "is a named pipe, not a regular file"},
		{"link to /dev/urandom", func(t *testing.T, path string) { require.NoError(t, os.Symlink("/dev/urandom", path)) },
			host.ErrLinkOut, "is a symbolic link out of the plugins directory"},
		// A valid module, but out of the directory.
		{"link out", func(t *testing.T, path string) { require.NoError(t, os.Symlink(good, path)) },
			host.ErrLinkOut, "is a symbolic link out of the plugins directory"},
		{"link out by ..", func(t *testing.T, path string) {
			require.NoError(t, os.Symlink(filepath.Join("..", filepath.Base(outside), "projector.wasm"), path))
		}, host.ErrLinkOut, "is a symbolic link out of the plugins directory"},
		{"directory", func(t *testing.T, path string) { require.NoError(t, os.Mkdir(path, 0o755)) },
			host.ErrNotRegular, "is a directory, not a regular file"},
		{"socket", func(t *testing.T, path string) {
			ln, err := net.Listen("unix", path)
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
		}, host.ErrNotRegular, "is a socket, not a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Beside outside, so that ../outside leads out.
			dir, err := os.MkdirTemp(filepath.Dir(outside), "plugins")
			require.NoError(t, err)
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			tc.make(t, filepath.Join(dir, "x.wasm"))
			l := newLoader(t, host.LoaderOptions{}, &testlog.Buffer{})
			mods, errs := loadDir(t, l, dir)
			require.Empty(t, mods)
			requireRefused(t, errs, "x.wasm", tc.cause, tc.want)
			require.Zero(t, host.CompilesStarted(l))
		})
	}
	// LoadFile follows the path it is given, but reads a regular file only.
	_, err := sharedLoader(t).LoadFile(context.Background(), "/dev/null")
	requireRefused(t, []error{err}, "null", host.ErrNotRegular, "is a device, not a regular file")
}

// A link that stays within the plugins directory is followed by default
// (a Kubernetes volume, a deploy that swaps a link) and refused, by name,
// with RefuseLinks ([plugins] follow_links = false).
func TestPluginLinksWithin(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "releases"), 0o755))
	wasmbuild.Copy(t, declared(t, "projector"), filepath.Join(dir, "releases"), "projector-1.wasm")
	require.NoError(t, os.Symlink(filepath.Join("releases", "projector-1.wasm"), filepath.Join(dir, "projector.wasm")))

	mods, errs := loadDir(t, newLoader(t, host.LoaderOptions{}, &testlog.Buffer{}), dir)
	require.Empty(t, errs)
	require.Len(t, mods, 1)
	require.Equal(t, "projector.wasm", mods[0].File)

	l := newLoader(t, host.LoaderOptions{RefuseLinks: true}, &testlog.Buffer{})
	mods, errs = loadDir(t, l, dir)
	require.Empty(t, mods)
	requireRefused(t, errs, "projector.wasm", host.ErrSymlink, "is a symbolic link")
	require.Zero(t, host.CompilesStarted(l))
}

// A file larger than its max_module_bytes (its tenant's, where it has
// one) is refused on its size before a byte of it is read: a sparse 1 GiB
// file is not read (the old code read it whole, then found no WebAssembly
// magic in its zeros), nothing close to its size is allocated, and nothing
// compiles.
func TestPluginFileSizeCheckedBeforeReading(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.wasm")
	f, err := os.Create(huge)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Truncate(huge, 1<<30))
	l := newLoader(t, host.LoaderOptions{}, &testlog.Buffer{})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	mods, errs := loadDir(t, l, dir)
	runtime.ReadMemStats(&after)
	require.Empty(t, mods)
	requireRefused(t, errs, "huge.wasm", host.ErrModuleTooLarge, "module file exceeds max_module_bytes: 1073741824 bytes (limit 33554432)")
	require.Zero(t, host.CompilesStarted(l))
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<20), "bytes allocated while refusing a 1 GiB file")

	// A tenant's limit applies before the read too.
	require.NoError(t, os.Remove(huge))
	small := wasmbuild.Copy(t, declared(t, "projector"), dir, "small.wasm")
	fi, err := os.Stat(small)
	require.NoError(t, err)
	l = newLoader(t, host.LoaderOptions{TenantLimits: func(module string) host.Limits {
		lim := generous(host.Limits{})
		if module == "small" {
			lim.MaxModuleBytes = 1024
		}
		return lim
	}}, &testlog.Buffer{})
	_, errs = loadDir(t, l, dir)
	requireRefused(t, errs, "small.wasm", host.ErrModuleTooLarge, "module file exceeds max_module_bytes: ")
	require.Contains(t, errs[0].Error(), "(limit 1024)", "%d bytes", fi.Size())
	require.Zero(t, host.CompilesStarted(l))
}

// A reload that meets a named pipe refuses it at once, naming it, applies
// the rest of the directory, and does not wedge the reloads after it: once
// the pipe is gone, the next reload finds nothing rejected.
func TestReloadAfterANamedPipe(t *testing.T) {
	ctx := context.Background()
	l := sharedLoader(t)
	dir := t.TempDir()
	wasmbuild.Copy(t, declared(t, "projector"), dir, "projector.wasm")
	running, errs := host.LoadSet(ctx, l, dir, inline)
	require.Empty(t, errs)
	applied := make(chan *host.Set, 1)
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: inline, Running: running,
		Apply: func(s *host.Set) { applied <- s }})
	t.Cleanup(func() { _ = running.Close(ctx) })
	reload := func() (host.Outcome, []error) {
		type result struct {
			out  host.Outcome
			errs []error
		}
		done := make(chan result, 1)
		go func() {
			out, errs := r.Reload(ctx)
			done <- result{out, errs}
		}()
		res := testwait.Recv(t, "the reload to return", done)
		return res.out, res.errs
	}

	wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
	fifo := filepath.Join(dir, "zz.wasm")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	out, errs := reload()
	require.Equal(t, host.Partial, out, "pm.wasm goes live beside the refused pipe")
	requireRefused(t, errs, "zz.wasm", host.ErrNotRegular, "is a named pipe")
	require.Equal(t, "zz.wasm", r.Status().Problems[0].File)
	require.Len(t, r.Status().Rejected, 1)
	require.Equal(t, "zz.wasm", r.Status().Rejected[0].File)
	next := <-applied
	t.Cleanup(func() { _ = next.Close(ctx) })
	require.NotNil(t, module(next, "pm.wasm"))

	require.NoError(t, os.Remove(fifo))
	out, errs = reload()
	require.Equal(t, host.Unchanged, out, "%v", errs)
	require.Empty(t, r.Status().Rejected)
}

// A plugins directory, or a module file, that others may write is logged
// at each load (WARN, naming the path and its mode), and refused by name
// with RefuseWritable.
func TestPluginsWritableByOthers(t *testing.T) {
	dir := t.TempDir()
	file := wasmbuild.Copy(t, declared(t, "projector"), dir, "projector.wasm")
	require.NoError(t, os.Chmod(dir, 0o777))

	logs := &testlog.Buffer{}
	mods, errs := loadDir(t, newLoader(t, host.LoaderOptions{}, logs), dir)
	require.Empty(t, errs)
	require.Len(t, mods, 1)
	require.Regexp(t, `level=WARN msg="writable by other users[^"]*" path=`+dir+` mode=0777`, logs.Take())

	_, errs = loadDir(t, newLoader(t, host.LoaderOptions{RefuseWritable: true}, logs), dir)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], host.ErrWritable)
	require.Contains(t, errs[0].Error(), "plugins directory "+dir+" is writable by other users (mode 0777)")

	// The file too, in a directory that is not.
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, os.Chmod(file, 0o666))
	_, errs = loadDir(t, newLoader(t, host.LoaderOptions{RefuseWritable: true}, logs), dir)
	requireRefused(t, errs, "projector.wasm", host.ErrWritable, file+" is writable by other users (mode 0666)")
	mods, errs = loadDir(t, newLoader(t, host.LoaderOptions{}, logs), dir)
	require.Empty(t, errs)
	require.Len(t, mods, 1)
	require.Contains(t, logs.Take(), "path="+file+" mode=0666")
}
