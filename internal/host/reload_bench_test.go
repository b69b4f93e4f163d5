package host_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkReload: one changed module (the client_orders example, two
// builds that differ in version) among the five examples.
//
//	watch/rename_to_serving  a started watch: from the rename of the new
//	                         file into the directory to the new set
//	                         applied (quiet period included)
//	reload/warm              Reload after the rename, warm compile cache
//	reload/cold              the same with a cold cache (a fresh loader)
//	baseline/load_one/warm   loading the changed file alone, warm: the
//	                         floor a reload of it cannot beat
//	baseline/load_one/cold   the same, cold
//	baseline/load_all/warm   loading the whole directory: what a reload
//	                         cost before unchanged modules were carried
func BenchmarkReload(b *testing.B) {
	ctx := context.Background()
	examples := wasmbuild.Examples(b)
	versions := [2]string{
		wasmbuild.Build(b, "./plugins/examples/client_orders", "version=1.0.0"),
		wasmbuild.Build(b, "./plugins/examples/client_orders", "version=1.0.1"),
	}
	broker := host.Broker{Name: "default", Provider: "inline"}
	warm := sharedLoader(b)
	for _, v := range versions { // warm the cache for both builds
		m, err := warm.LoadFile(ctx, v)
		if err != nil {
			b.Fatal(err)
		}
		_ = m.Close(ctx)
	}

	// setup returns a directory of the examples and a function making a
	// reloader on a loader over the running set; the reloaders' apply
	// closes the set it replaces and reports the new one.
	setup := func(b *testing.B) (string, func(*host.Loader) *host.Reloader, chan *host.Set) {
		dir := b.TempDir()
		entries, err := os.ReadDir(examples)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range entries {
			wasmbuild.Copy(b, filepath.Join(examples, e.Name()), dir, e.Name())
		}
		cur, errs := host.LoadSet(ctx, warm, dir, broker)
		if len(errs) > 0 {
			b.Fatal(errs)
		}
		// applied receives the set a reload retired. The engine closes a
		// retired set on a goroutine of its own once its calls have left;
		// here the loop closes it after stopping the timer.
		applied := make(chan *host.Set, 1)
		b.Cleanup(func() { _ = cur.Close(ctx) })
		return dir, func(l *host.Loader) *host.Reloader {
			return host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: broker, Running: cur,
				Apply: func(s *host.Set) {
					old := cur
					cur = s
					applied <- old
				}})
		}, applied
	}
	// stage writes version i next to the module, for an atomic rename.
	stage := func(b *testing.B, dir string, i int) (tmp, dst string) {
		return wasmbuild.Copy(b, versions[i%2], dir, "client_orders.wasm.tmp"), filepath.Join(dir, "client_orders.wasm")
	}
	reload := func(b *testing.B, loader func() *host.Loader) {
		dir, reloader, applied := setup(b)
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			tmp, dst := stage(b, dir, i+1)
			r := reloader(loader())
			b.StartTimer()
			if err := os.Rename(tmp, dst); err != nil {
				b.Fatal(err)
			}
			if out, errs := r.Reload(ctx); out != host.Applied {
				b.Fatal(out, errs)
			}
			old := <-applied
			b.StopTimer()
			_ = old.Close(ctx)
			b.StartTimer()
		}
	}

	b.Run("watch/rename_to_serving", func(b *testing.B) {
		dir, reloader, applied := setup(b)
		r := reloader(warm)
		if err := r.Start(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = r.Stop(ctx) })
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			tmp, dst := stage(b, dir, i+1)
			b.StartTimer()
			if err := os.Rename(tmp, dst); err != nil {
				b.Fatal(err)
			}
			old := <-applied
			b.StopTimer()
			_ = old.Close(ctx)
			b.StartTimer()
		}
	})
	b.Run("reload/warm", func(b *testing.B) { reload(b, func() *host.Loader { return warm }) })
	b.Run("reload/cold", func(b *testing.B) {
		reload(b, func() *host.Loader {
			l, err := host.NewLoader(host.LoaderOptions{}) // an in-memory cache of its own: cold
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close(ctx) })
			return l
		})
	})
	loadOne := func(b *testing.B, loader func() *host.Loader) {
		for i := range b.N {
			b.StopTimer()
			l := loader()
			b.StartTimer()
			m, err := l.LoadFile(ctx, versions[i%2])
			if err != nil {
				b.Fatal(err)
			}
			_ = m.Close(ctx)
		}
	}
	b.Run("baseline/load_one/warm", func(b *testing.B) { loadOne(b, func() *host.Loader { return warm }) })
	b.Run("baseline/load_one/cold", func(b *testing.B) {
		loadOne(b, func() *host.Loader {
			l, err := host.NewLoader(host.LoaderOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close(ctx) })
			return l
		})
	})
	b.Run("baseline/load_all/warm", func(b *testing.B) {
		for range b.N {
			s, errs := host.LoadSet(ctx, warm, examples, broker)
			if len(errs) > 0 {
				b.Fatal(errs)
			}
			_ = s.Close(ctx)
		}
	})
}
