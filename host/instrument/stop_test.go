package instrument_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero/api"

	"github.com/proteanhq/protean-host/host/instrument"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A guest looping in compiled code calls into the host every Period
// checks, and traps right after the host leaves its fuel at 0; until then
// it computes what the original computes.
func TestFuelStopsARunningLoop(t *testing.T) {
	res, err := instrument.Module(sumLoop)
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
