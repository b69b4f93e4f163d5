package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// orderSession serves client_orders its document.
type orderSession struct{}

func (orderSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	return abi.LoadResponse{Found: true, Version: 1, Data: json.RawMessage(`{"client_id":"c-1","orders":1,"total":1,"order_ids":["a"]}`)}
}

func (orderSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

var orderPlaced = []abi.Envelope{{ID: "e-1", Type: "OrderPlaced", Stream: "order-o-1",
	Data: json.RawMessage(`{"order_id":"o-1","client_id":"c-1","total":42.5}`)}}

// benchModules loads Go client_orders builds on l for the idle
// benchmarks and calls them, in the sub-benchmark b; the modules stay
// loaded until keep, the whole benchmark, ends (the reaper runs while one
// is loaded, and a restart of it would move its sweeps).
type benchModules struct {
	b, keep *testing.B
	l       *Loader
}

func (c benchModules) load(path string) *Module {
	m, err := c.l.LoadFile(context.Background(), path)
	if err != nil {
		c.b.Fatal(err)
	}
	c.keep.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// handle makes one call of m and returns how long it took.
func (c benchModules) handle(m *Module) time.Duration {
	start := time.Now()
	res, err := m.Handle(context.Background(), "client_orders", orderPlaced, orderSession{})
	d := time.Since(start)
	if err != nil || len(res) != 1 || res[0].Error != nil {
		c.b.Fatalf("%v %+v", err, res)
	}
	return d
}

// versions loads n distinct builds of client_orders (version=1.0.i),
// each under its own file name, and returns them with their build paths.
func (c benchModules) versions(n int) (mods []*Module, paths []string) {
	dir := c.b.TempDir()
	for i := range n {
		path := wasmbuild.Build(c.b, "./plugins/examples/client_orders", fmt.Sprintf("version=1.0.%d", i))
		mods = append(mods, c.load(wasmbuild.Copy(c.b, path, dir, fmt.Sprintf("client_orders_%d.wasm", i))))
		paths = append(paths, path)
	}
	return mods, paths
}

// firstCall reports warm_ms, the mean of warmCalls calls of a loaded
// client_orders, beside cold_ms and cold_max_ms, the mean and worst of
// coldCalls calls each after cool, and x_warm, the one over the other.
func (c benchModules) firstCall(warmCalls, coldCalls int, cool func(*Module)) {
	m := c.load(wasmbuild.Build(c.b, "./plugins/examples/client_orders"))
	c.handle(m)
	var warm, cold, worst time.Duration
	for range warmCalls {
		warm += c.handle(m)
	}
	for range coldCalls {
		cool(m)
		d := c.handle(m)
		cold += d
		worst = max(worst, d)
	}
	warmMS := float64(warm.Microseconds()) / 1000 / float64(warmCalls)
	coldMS := float64(cold.Microseconds()) / 1000 / float64(coldCalls)
	c.b.ReportMetric(warmMS, "warm_ms")
	c.b.ReportMetric(coldMS, "cold_ms")
	c.b.ReportMetric(float64(worst.Microseconds())/1000, "cold_max_ms")
	c.b.ReportMetric(coldMS/warmMS, "x_warm")
}

// BenchmarkIdleReclaim measures what instance_idle_ms costs and saves
// (issue 21), on the Go client_orders example with a warm compiled-code
// cache, the reaper driven by a fake clock. Run it once:
//
//	go test ./internal/host/ -run '^$' -bench IdleReclaim -benchtime 1x
//
// first_call: a call after the module's instances were all reclaimed
// (cold_ms, it makes an instance: the target is <= 50 ms) beside
// a call on an idle instance in the same run (warm_ms), and x_warm, the
// one over the other. rss: the process's RSS before (base_MB) and with
// N=20 distinct builds of the module loaded (loaded_MB, and
// loaded_MB_per_module: compiled code and the rest a loaded module
// holds without an instance), after one call each (called_MB, the
// baseline: what a host keeps today), and after every instance was
// reclaimed (reclaimed_MB; both after a GC that returns freed memory to
// the OS); freed_MB_per_module and x_called, reclaimed over called.
func BenchmarkIdleReclaim(bench *testing.B) {
	b := bench
	if testing.Short() {
		b.Skip("builds and compiles 20 modules")
	}
	clk := newFakeClock()
	l, err := NewLoader(LoaderOptions{Limits: Limits{InstanceIdle: time.Minute}, Clock: clk, CacheDir: wasmbuild.CacheDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	reclaimAll := func(mods ...*Module) {
		clk.advance(time.Minute)
		clk.sweep(b)
		for _, m := range mods {
			if st := m.Instances(); st.Live != 0 {
				b.Fatalf("%s: %+v after a sweep past its idle limit", m.File, st)
			}
		}
	}

	b.Run("first_call", func(b *testing.B) {
		benchModules{b, bench, l}.firstCall(200, 20, func(m *Module) { reclaimAll(m) })
	})

	b.Run("rss", func(b *testing.B) {
		const n = 20
		c := benchModules{b, bench, l}
		base := rssMB(b)
		mods, _ := c.versions(n)
		loaded := rssMB(b)
		for _, m := range mods {
			c.handle(m)
		}
		called := rssMB(b)
		reclaimAll(mods...)
		reclaimed := rssMB(b)
		b.ReportMetric(base, "base_MB")
		b.ReportMetric(loaded, "loaded_MB")
		b.ReportMetric((loaded-base)/n, "loaded_MB_per_module")
		b.ReportMetric(called, "called_MB")
		b.ReportMetric(reclaimed, "reclaimed_MB")
		b.ReportMetric((called-reclaimed)/n, "freed_MB_per_module")
		b.ReportMetric(reclaimed/called, "x_called")
	})
}

// rssMB is the process's resident set after a GC that returns freed
// memory to the OS.
func rssMB(tb testing.TB) float64 {
	tb.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	status, err := os.ReadFile(filepath.Join("/proc", "self", "status"))
	if err != nil {
		tb.Skip("no /proc/self/status:", err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb / 1024
		}
	}
	tb.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkCodeIdle measures what code_idle_ms saves and costs (issue
// 21), as BenchmarkIdleReclaim does for instance_idle_ms, on the Go
// client_orders example with a warm compiled-code cache on disk. Run it
// once:
//
//	go test ./internal/host/ -run '^$' -bench CodeIdle -benchtime 1x
//
// rss: the process's RSS before (base_MB), with N=20 distinct builds
// loaded (loaded_MB), after one call each (called_MB), after every
// instance was reclaimed (reclaimed_MB, today's idle host) and after
// every module's code was released (released_MB); per module:
// loaded_MB_per_module, instance_MB_per_module (called over reclaimed),
// code_MB_per_module (reclaimed over released) and kept_MB_per_module
// (released over base: what an idle module still costs). packed_MB is the
// module's file compressed as a module keeps it to compile again. first_call: the first
// call after a release (cold_ms, a compile from the disk cache and an
// instance) beside a call on an idle instance (warm_ms), same run.
func BenchmarkCodeIdle(bench *testing.B) {
	b := bench
	if testing.Short() {
		b.Skip("builds and compiles 20 modules")
	}
	clk := newFakeClock()
	l, err := NewLoader(LoaderOptions{Limits: Limits{InstanceIdle: time.Minute, CodeIdle: 2 * time.Minute}, Clock: clk,
		CacheDir: wasmbuild.CacheDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	// idle moves past instance_idle, then code_idle: a sweep each.
	idle := func(code bool, mods ...*Module) {
		clk.advance(time.Minute)
		clk.sweep(b)
		if code {
			clk.advance(time.Minute)
			clk.sweep(b)
		}
		for _, m := range mods {
			if st := m.Instances(); st.Live != 0 || st.CodeLoaded == code {
				b.Fatalf("%s: %+v", m.File, st)
			}
		}
	}

	b.Run("rss", func(b *testing.B) {
		const n = 20
		c := benchModules{b, bench, l}
		base := rssMB(b)
		mods, paths := c.versions(n)
		var packed int
		for _, path := range paths {
			raw, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			packed += len(packer().EncodeAll(raw, nil))
		}
		loaded := rssMB(b)
		for _, m := range mods {
			c.handle(m)
		}
		called := rssMB(b)
		idle(false, mods...)
		reclaimed := rssMB(b)
		clk.advance(time.Minute)
		clk.sweep(b)
		for _, m := range mods {
			if st := m.Instances(); st.CodeLoaded {
				b.Fatalf("%s: %+v", m.File, st)
			}
		}
		rssMB(b) // the executable memory is unmapped by a finalizer: a second GC sees it gone
		released := rssMB(b)
		b.ReportMetric(base, "base_MB")
		b.ReportMetric(loaded, "loaded_MB")
		b.ReportMetric(called, "called_MB")
		b.ReportMetric(reclaimed, "reclaimed_MB")
		b.ReportMetric(released, "released_MB")
		b.ReportMetric((loaded-base)/n, "loaded_MB_per_module")
		b.ReportMetric((called-reclaimed)/n, "instance_MB_per_module")
		b.ReportMetric((reclaimed-released)/n, "code_MB_per_module")
		b.ReportMetric((released-base)/n, "kept_MB_per_module")
		b.ReportMetric(float64(packed)/n/(1<<20), "packed_MB")
	})

	b.Run("first_call", func(b *testing.B) {
		benchModules{b, bench, l}.firstCall(100, 5, func(m *Module) { idle(true, m) })
	})
}
