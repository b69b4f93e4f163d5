package instrument_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero/api"

	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A guest looping in compiled code calls into the host every Period
// checks, and traps right after the host leaves its fuel at 0; until then
// it computes what the original computes.
func TestFuelStopsARunningLoop(t *testing.T) {
	res, err := instrument.Module(sumLoop, instrument.Limits{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Checks)

	var calls atomic.Int64
	var stop atomic.Bool
	entered := make(chan struct{}, 1)
	mod := instantiate(t, res.Bytes, false, func(fuel api.MutableGlobal) {
		calls.Add(1)
		select {
		case entered <- struct{}{}:
		default:
		}
		if stop.Load() {
			fuel.Set(0)
			return
		}
		fuel.Set(instrument.Period)
	})
	ctx := context.Background()
	got, err := mod.ExportedFunction("loop").Call(ctx, 3*instrument.Period)
	require.NoError(t, err)
	want, err := loopFunc(t, sumLoop, false).Call(ctx, 3*instrument.Period)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.EqualValues(t, 3, calls.Load(), "one host call per Period iterations")

	<-entered // from the first call
	done := make(chan error, 1)
	go func() {
		_, err := mod.ExportedFunction("loop").Call(ctx, 0) // 2^32 iterations
		done <- err
	}()
	testwait.Recv(t, "the guest to call into the host", entered)
	stop.Store(true)
	err = testwait.Recv(t, "the loop to stop", done)
	require.ErrorContains(t, err, "unreachable")
}

// recursion builds a module whose exports recurse without loops, taking
// 2^n calls: self calls itself, mutual goes through a second function,
// indirect through the table.
func recursion() []byte {
	fib := func(call []byte) []byte { // n == 0 ? 0 : f(n-1) + f(n-1)
		b := []byte{0x00, 0x20, 0x00, 0x45, 0x04, 0x7F, 0x41, 0x00, 0x05}
		for range 2 {
			b = append(append(b, 0x20, 0x00, 0x41, 0x01, 0x6B), call...)
		}
		return append(b, 0x6A, 0x0B, 0x0B)
	}
	bodies := [][]byte{
		fib([]byte{0x10, 0x01}),                   // 1 self
		fib([]byte{0x10, 0x03}),                   // 2 mutual → 3
		{0x00, 0x20, 0x00, 0x10, 0x02, 0x0B},      // 3 → 2
		fib([]byte{0x41, 0x00, 0x11, 0x00, 0x00}), // 4 indirect, table[0] = 4
	}
	m := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	m = append(m, section(1, []byte{0x02, 0x60, 0x01, 0x7F, 0x01, 0x7F, 0x60, 0x00, 0x01, 0x7F})...)
	imp := append([]byte{0x01}, uleb(nil, uint32(len(instrument.YieldModule)))...)
	imp = append(imp, instrument.YieldModule...)
	imp = uleb(imp, uint32(len(instrument.YieldImport)))
	imp = append(imp, instrument.YieldImport...)
	m = append(m, section(2, append(imp, 0x00, 0x01))...)
	m = append(m, section(3, []byte{0x04, 0x00, 0x00, 0x00, 0x00})...)
	m = append(m, section(4, []byte{0x01, 0x70, 0x00, 0x01})...)
	exp := []byte{0x03}
	for i, name := range []string{"self", "mutual", "indirect"} {
		exp = append(uleb(exp, uint32(len(name))), name...)
		exp = append(exp, 0x00, []byte{1, 2, 4}[i])
	}
	m = append(m, section(7, exp)...)
	m = append(m, section(9, []byte{0x01, 0x00, 0x41, 0x00, 0x0B, 0x01, 0x04})...)
	code := []byte{byte(len(bodies))}
	for _, b := range bodies {
		code = append(uleb(code, uint32(len(b))), b...)
	}
	return append(m, section(10, code)...)
}

// Recursion without loops (2^60 calls) is stopped too: functions on a
// cycle of the call graph check at their entry.
func TestFuelStopsRecursionWithoutLoops(t *testing.T) {
	res, err := instrument.Module(recursion(), instrument.Limits{})
	require.NoError(t, err)
	for _, export := range []string{"self", "mutual", "indirect"} {
		var stop atomic.Bool
		entered := make(chan struct{}, 1)
		mod := instantiate(t, res.Bytes, false, func(fuel api.MutableGlobal) {
			select {
			case entered <- struct{}{}:
			default:
			}
			if stop.Load() {
				fuel.Set(0)
				return
			}
			fuel.Set(instrument.Period)
		})
		got, err := mod.ExportedFunction(export).Call(context.Background(), 10)
		require.NoError(t, err, export)
		require.Equal(t, []uint64{0}, got, export)
		select { // 2^10 calls are fewer than a Period: maybe no call in yet
		case <-entered:
		default:
		}
		done := make(chan error, 1)
		go func() {
			_, err := mod.ExportedFunction(export).Call(context.Background(), 60)
			done <- err
		}()
		testwait.Recv(t, export+": the guest to call into the host", entered)
		stop.Store(true)
		require.ErrorContains(t, testwait.Recv(t, export+": the recursion to stop", done), "unreachable", export)
	}
}
