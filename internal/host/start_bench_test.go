package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// distinctCopies writes n copies of the module file src into dir, each
// with a custom section of its own appended, so that each has bytes, a
// SHA-256 and a compile of its own, as n tenants' modules would, at the
// cost of one build. With PROTEAN_BENCH_SAME=1 the copies are the same
// bytes, as n tenants running one application, which share one compile. A non-nil manifest is embedded in each as its
// protean.manifest section (abi.EmbedManifest, as plugin embed-manifest
// does).
func distinctCopies(tb testing.TB, src, dir string, n int, manifest []byte) {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	name := "protean.bench"
	same := os.Getenv("PROTEAN_BENCH_SAME") == "1"
	for i := range n {
		payload := binary.AppendUvarint(nil, uint64(len(name)))
		payload = append(payload, name...)
		payload = binary.AppendUvarint(payload, uint64(i))
		copyB := slices.Clip(b)
		if !same {
			copyB = append(copyB, 0) // custom section id
			copyB = binary.AppendUvarint(copyB, uint64(len(payload)))
			copyB = append(copyB, payload...)
		}
		if manifest != nil {
			if copyB, err = abi.EmbedManifest(copyB, manifest); err != nil {
				tb.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("m%05d.wasm", i)), copyB, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkStart measures a host's start and its density with N distinct
// modules (issue 21): PROTEAN_BENCH_MODULES (default 20) copies of the Go
// client_orders example, or with PROTEAN_BENCH_GUEST=c of the C one, each
// with bytes of its own (distinctCopies), loaded from one directory, with
// code_idle_ms on (the reaper driven by a fake clock). With
// PROTEAN_BENCH_EMBED=1 each copy carries its manifest in its
// protean.manifest section (read once from the module, compiled, before
// anything is timed), so cold_s is a start that reads the sections and
// compiles nothing (embedded reports 1). Run it once:
//
//	PROTEAN_BENCH_MODULES=200 go test ./internal/host/ -run '^$' -bench Start -benchtime 1x
//	PROTEAN_BENCH_MODULES=200 PROTEAN_BENCH_EMBED=1 go test ./internal/host/ -run '^$' -bench Start -benchtime 1x
//
// The baselines load as every start did before manifest memos (as a
// reload loads a file with no memo: compiled, then asked its manifest):
// cold_compiled_s on an empty cache, warm_compiled_s with the compiled
// code cached. cold_s: a start on an empty cache (manifests read on the
// interpreter), and cold_first_call_s, cold_s plus one module's first call
// (its compile): when a cold host serves its first command. warm_s: a
// start with the code cached and the memos at hand, which compiles
// nothing; x_warm_compiled and x_cold_compiled are the ratios. idle_MB:
// the process's RSS after the warm start (base_MB before any), and
// idle_MB_per_module. first_call_ms and first_call_max_ms: each module's
// first call after it (its compile from the cache and its first
// instance). called_MB: RSS after one call each; reclaimed_MB after the
// reaper closed every instance and released every module's code. With
// PROTEAN_BENCH_IDLE=1 it measures the cold start and idle_MB only.
func BenchmarkStart(b *testing.B) {
	n := 20
	if s := os.Getenv("PROTEAN_BENCH_MODULES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n <= 0 {
			b.Fatalf("PROTEAN_BENCH_MODULES=%q", s)
		}
	}
	src := wasmbuild.Build(b, "./plugins/examples/client_orders")
	if os.Getenv("PROTEAN_BENCH_GUEST") == "c" {
		src = wasmbuild.BuildC(b, "plugins/c/client_orders.c")
	}
	var manifest []byte
	embedded := 0.0
	if os.Getenv("PROTEAN_BENCH_EMBED") == "1" {
		manifest, embedded = benchManifest(b, src), 1
	}
	plugins, cache := b.TempDir(), b.TempDir()
	distinctCopies(b, src, plugins, n, manifest)
	lim := Limits{InstanceIdle: time.Minute, CodeIdle: 2 * time.Minute}
	base := rssMB(b)
	// start loads the directory on a new loader over cache, as a start
	// does, or compiled (as every start did before memos), and returns its
	// modules, how long it took, what closes them, and its reaper's clock.
	start := func(cache string, compiled bool) ([]*Module, time.Duration, func(), *fakeClock) {
		clk := newFakeClock()
		l, err := NewLoader(LoaderOptions{Limits: lim, Clock: clk, CacheDir: cache, GuestConcurrency: -1, CompileLater: true})
		if err != nil {
			b.Fatal(err)
		}
		var running *Set
		if compiled {
			running = &Set{}
		}
		began := time.Now()
		mods, errs := l.loadDir(context.Background(), plugins, running)
		took := time.Since(began)
		l.warmups.Wait() // the sources packed, before the memory is measured
		if len(errs) > 0 || len(mods) != n {
			b.Fatalf("%d modules, errors: %v", len(mods), errs)
		}
		return mods, took, func() {
			for _, m := range mods {
				_ = m.Close(context.Background())
			}
			_ = l.Close(context.Background())
		}, clk
	}
	forget := func() {
		if err := os.RemoveAll(filepath.Join(cache, memoDir)); err != nil {
			b.Fatal(err)
		}
	}
	c := benchModules{b: b, keep: b}
	if os.Getenv("PROTEAN_BENCH_IDLE") == "1" {
		// A cold start and what its modules hold idle, nothing else: for
		// an N too large to compile here (1,000 Go modules would take ~40
		// CPU-minutes).
		_, cold, stop, _ := start(cache, false)
		defer stop()
		idle := rssMB(b)
		b.ReportMetric(float64(n), "modules")
		b.ReportMetric(embedded, "embedded")
		b.ReportMetric(cold.Seconds(), "cold_s")
		b.ReportMetric(base, "base_MB")
		b.ReportMetric(idle, "idle_MB")
		b.ReportMetric((idle-base)/float64(n), "idle_MB_per_module")
		return
	}
	_, coldCompiled, stop, _ := start(cache, true)
	stop()
	mods, cold, stop, _ := start(b.TempDir(), false)
	coldFirst := cold + c.handle(mods[0])
	stop()
	forget()
	_, warmCompiled, stop, _ := start(cache, true)
	stop()
	mods, warm, stop, clk := start(cache, false)
	defer stop()
	for _, m := range mods {
		if !m.fromMemo || m.Instances().CodeLoaded {
			b.Fatalf("%s was compiled at a start with its memo", m.File)
		}
	}
	idle := rssMB(b)
	var first, worst time.Duration
	for _, m := range mods {
		d := c.handle(m)
		first += d
		worst = max(worst, d)
	}
	called := rssMB(b)
	clk.advance(time.Minute)
	clk.sweep(b)
	clk.advance(time.Minute)
	clk.sweep(b)
	rssMB(b) // the executable memory is unmapped by a finalizer: a second GC sees it gone
	reclaimed := rssMB(b)
	b.ReportMetric(float64(n), "modules")
	b.ReportMetric(embedded, "embedded")
	b.ReportMetric(coldCompiled.Seconds(), "cold_compiled_s")
	b.ReportMetric(cold.Seconds(), "cold_s")
	b.ReportMetric(coldFirst.Seconds(), "cold_first_call_s")
	b.ReportMetric(cold.Seconds()/coldCompiled.Seconds(), "x_cold_compiled")
	b.ReportMetric(warmCompiled.Seconds(), "warm_compiled_s")
	b.ReportMetric(warm.Seconds(), "warm_s")
	b.ReportMetric(warm.Seconds()/warmCompiled.Seconds(), "x_warm_compiled")
	b.ReportMetric(base, "base_MB")
	b.ReportMetric(idle, "idle_MB")
	b.ReportMetric((idle-base)/float64(n), "idle_MB_per_module")
	b.ReportMetric(float64(first.Microseconds())/1000/float64(n), "first_call_ms")
	b.ReportMetric(float64(worst.Microseconds())/1000, "first_call_max_ms")
	b.ReportMetric(called, "called_MB")
	b.ReportMetric(reclaimed, "reclaimed_MB")
}

// benchManifest is the manifest the module file src answers, read by a
// compiled load on a loader of its own (no cache: nothing of it is left
// for the timed starts).
func benchManifest(b *testing.B, src string) []byte {
	b.Helper()
	l, err := NewLoader(LoaderOptions{GuestConcurrency: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	m, err := l.LoadFile(context.Background(), src)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	return m.ManifestJSON()
}
