package host

import (
	"context"
	"fmt"
	"testing"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestClosedModuleFreesItsCompiledCode: a module a reload replaced gives
// its compiled code back when it closes. On the loader's one shared
// compilation cache it did not (wazero frees compiled code only with an
// engine, and every runtime of a cache shares one): each version of a Go
// module loaded and closed kept about 24 MB until the loader closed.
// Four versions loaded and closed one after another must not grow the
// process by more than one module's code; on the shared engine they grew
// it by three.
func TestClosedModuleFreesItsCompiledCode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and compiles four versions of a Go module")
	}
	l, err := NewLoader(LoaderOptions{CacheDir: wasmbuild.CacheDir(t), GuestConcurrency: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	paths := make([]string, 4)
	for i := range paths {
		paths[i] = wasmbuild.Build(t, "./plugins/examples/client_orders", fmt.Sprintf("version=9.1.%d", i))
	}
	var first, last, loaded float64
	for i, p := range paths {
		m, err := l.LoadFile(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Handle(context.Background(), "client_orders", orderPlaced, orderSession{}); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			loaded = rssMB(t)
		}
		if err := m.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		last = rssMB(t)
		if i == 0 {
			first = last
		}
	}
	perModule := loaded - first // what one loaded module held and its close gave back
	t.Logf("RSS after the first close %.1f MB, after the fourth %.1f MB; one module held %.1f MB", first, last, perModule)
	if grew := last - first; grew > max(perModule, 8) {
		t.Fatalf("three more versions loaded and closed grew the process by %.1f MB (one module holds %.1f MB): closed modules keep their compiled code", grew, perModule)
	}
}
