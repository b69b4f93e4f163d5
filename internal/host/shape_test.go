package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestCompileBombsRefusedBeforeCompiling: a module over a shape limit
// (the default limits) is refused with a LoadError naming the file, the
// function and the limit, whatever the deadline mode, and no compilation
// starts for it (so none keeps burning a core in the background). A module
// just within the limits compiles.
func TestCompileBombsRefusedBeforeCompiling(t *testing.T) {
	times := func(n int, body []byte) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = body
		}
		return out
	}
	flat := []byte{0}
	for len(flat) < 1<<20 {
		flat = append(flat, 0x41, 0, 0x1a) // i32.const 0; drop
	}
	flat = append(flat, 0x41, 0, 0x0b)
	tests := []struct {
		name  string
		bytes []byte
		fn    int64
		limit string
		max   uint64
	}{
		{"nesting.wasm", wasmbuild.CompileBomb(20000), 0, instrument.LimitNestingDepth, 8192},
		// 12 functions 2,896 deep: each within max_nesting_depth, together
		// over max_nesting_cost (12 x 2896^2 = 100.6M), at the 12th.
		{"nesting_cost.wasm", wasmbuild.RawFuncs(times(12, wasmbuild.Nested(2896))...), 11, instrument.LimitNestingCost, 100_000_000},
		{"locals.wasm", wasmbuild.RawFuncs(wasmbuild.WithLocals(50_001)), 0, instrument.LimitLocals, 50_000},
		{"module_locals.wasm", wasmbuild.RawFuncs(times(21, wasmbuild.WithLocals(50_000))...), 20, instrument.LimitModuleLocals, 1_000_000},
		{"body.wasm", wasmbuild.RawFuncs(flat), 0, instrument.LimitFunctionBytes, 1 << 20},
		{"functions.wasm", wasmbuild.RawFuncs(times(100_001, wasmbuild.WithLocals(0))...), -1, instrument.LimitFunctions, 100_000},
	}
	modes := []struct {
		name string
		lim  host.Limits
	}{
		{"instrumented", host.Limits{}},
		{"runtime_deadline", host.Limits{RuntimeDeadline: true}},
		{"uninterruptible", host.Limits{Uninterruptible: true}},
	}
	for _, mode := range modes {
		l, err := host.NewLoader(host.LoaderOptions{Limits: mode.lim})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		for _, tc := range tests {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				before := host.CompilesStarted(l)
				_, err := loadBytes(t, l, tc.name, tc.bytes)
				var le *host.LoadError
				require.ErrorAs(t, err, &le)
				require.Equal(t, tc.name, le.File)
				require.ErrorIs(t, err, host.ErrShapeLimit)
				var se *instrument.LimitError
				require.ErrorAs(t, err, &se)
				require.Equal(t, tc.limit, se.Limit, "%v", err)
				require.Equal(t, tc.fn, se.Func, "%v", err)
				require.Equal(t, tc.max, se.Max, "%v", err)
				require.Contains(t, err.Error(), tc.limit)
				require.Equal(t, before, host.CompilesStarted(l), "a compilation started for a refused module")
			})
		}
	}

	// Within every limit (nesting cost 8192^2 + 3 x 2896^2 = 92.3M): loads
	// (and is compiled, under -race on a busy machine in more than the
	// default compile_timeout_ms).
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{})})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	before := host.CompilesStarted(l)
	within := wasmbuild.RawFuncs(append([][]byte{wasmbuild.Nested(8192), wasmbuild.WithLocals(50_000)}, times(3, wasmbuild.Nested(2896))...)...)
	start := time.Now()
	_, err = loadBytes(t, l, "within.wasm", within)
	t.Logf("a module at the nesting limits loaded in %v", time.Since(start))
	require.ErrorIs(t, err, abi.ErrManifest) // it compiled and ran; its "manifest" returns 0, not a manifest
	require.Equal(t, before+1, host.CompilesStarted(l))
}
