package instrument_test

import (
	"context"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// sumLoop exports loop(n i32) i32: an integer loop that adds n, n-1, …, 1
// into an accumulator, calling nothing. It imports WASI's sched_yield, as
// every Go module does, for the instrumentation to call into the host.
var sumLoop = []byte{
	0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00,
	0x01, 0x0A, 0x02, 0x60, 0x01, 0x7F, 0x01, 0x7F, 0x60, 0x00, 0x01, 0x7F, // types: [i32] -> [i32], [] -> [i32]
	0x02, 0x26, 0x01, 0x16, 'w', 'a', 's', 'i', '_', 's', 'n', 'a', 'p', 's', 'h', 'o', 't', '_', 'p', 'r', 'e', 'v', 'i', 'e', 'w', '1',
	0x0B, 's', 'c', 'h', 'e', 'd', '_', 'y', 'i', 'e', 'l', 'd', 0x00, 0x01, // import func 0: sched_yield
	0x03, 0x02, 0x01, 0x00, // func 1: type 0
	0x07, 0x08, 0x01, 0x04, 'l', 'o', 'o', 'p', 0x00, 0x01, // export "loop" func 1
	0x0A, 0x1B, 0x01, 0x19,
	0x01, 0x01, 0x7F, // one i32 local: the accumulator
	0x03, 0x40, // loop
	0x20, 0x01, 0x20, 0x00, 0x6A, 0x21, 0x01, // acc += n
	0x20, 0x00, 0x41, 0x01, 0x6B, 0x22, 0x00, // n = n - 1
	0x0D, 0x00, // br_if 0 (while n != 0)
	0x0B,
	0x20, 0x01, // acc
	0x0B,
}

// instantiate compiles b in a runtime with WASI, with or without
// close-on-context-done, its sched_yield answered by yield (refilling the
// fuel when nil).
func instantiate(tb testing.TB, b []byte, closeOnDone bool, yield func(fuel api.MutableGlobal)) api.Module {
	tb.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCloseOnContextDone(closeOnDone))
	tb.Cleanup(func() { _ = rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var fuel api.MutableGlobal
	hook := func() {
		if yield != nil {
			yield(fuel)
		} else if fuel != nil {
			fuel.Set(instrument.Period)
		}
	}
	mod, err := rt.InstantiateWithConfig(ctx, b, wazero.NewModuleConfig().WithOsyield(hook).WithStartFunctions())
	if err != nil {
		tb.Fatal(err)
	}
	fuel, _ = mod.ExportedGlobal(instrument.FuelGlobal).(api.MutableGlobal)
	return mod
}

func loopFunc(tb testing.TB, b []byte, closeOnDone bool) api.Function {
	return instantiate(tb, b, closeOnDone, nil).ExportedFunction("loop")
}

// BenchmarkIntegerLoop measures one loop iteration under each deadline
// mechanism, side by side: none (the baseline), wazero's
// close-on-context-done, and the instrumented module's stop flag. Compare
// ns/iter.
func BenchmarkIntegerLoop(b *testing.B) {
	res, err := instrument.Module(sumLoop, instrument.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	const n = 1 << 20
	for _, v := range []struct {
		name        string
		code        []byte
		closeOnDone bool
	}{
		{"deadline=off", sumLoop, false},
		{"deadline=runtime", sumLoop, true},
		{"deadline=instrumented", res.Bytes, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			f := loopFunc(b, v.code, v.closeOnDone)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for b.Loop() {
				if _, err := f.Call(ctx, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/iter")
		})
	}
}

// BenchmarkShapeCheck: instrumenting the Go example module without shape
// limits (the baseline) and with host.DefaultLimits' shape limits (the
// check rides on the same walk); and the walk alone (Check), what a module
// that is not instrumented pays.
func BenchmarkShapeCheck(b *testing.B) {
	code, err := os.ReadFile(wasmbuild.Build(b, "./plugins/examples/client_orders"))
	if err != nil {
		b.Fatal(err)
	}
	lim := instrument.Limits{MaxFunctions: 100_000, MaxFunctionBytes: 1 << 20, MaxLocals: 50_000, MaxModuleLocals: 1_000_000,
		MaxNestingDepth: 8192, MaxNestingCost: 100_000_000}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"module_unlimited", func() error { _, err := instrument.Module(code, instrument.Limits{}); return err }},
		{"module_limited", func() error { _, err := instrument.Module(code, lim); return err }},
		{"check_alone", func() error { return instrument.Check(code, lim) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(code)))
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
