package host

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// A guest's linear memory is off the Go heap (the non-moving allocator):
// a guest that holds 64 MiB adds nothing like it to the heap, and the
// meter still counts it.
func TestGuestMemoryIsOffTheGoHeap(t *testing.T) {
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, MemoryMB: 128, RecycleAboveMB: 128},
		CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	grow := []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"grow","id":"d","arg":"64"}`)}}
	_, err = m.Handle(context.Background(), "behave", okBatch, nopSession{}) // the instance
	require.NoError(t, err)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()
	_, err = m.Handle(context.Background(), "behave", grow, nopSession{})
	require.NoError(t, err)
	after := heap()
	require.Less(t, int64(after)-int64(before), int64(16<<20), "heap in use %d -> %d bytes", before, after)
	require.GreaterOrEqual(t, m.Usage().GuestMemoryBytes, uint64(64<<20), "the meter counts the memory")
}

// panicMemory is a linear memory whose system refuses every page.
type panicMemory struct{ freed bool }

func (p *panicMemory) Reallocate(uint64) []byte { panic("mprotect: cannot allocate memory") }
func (p *panicMemory) Free()                    { p.freed = true }

// A memory whose first pages the system refuses becomes a Go slice; a
// later growth it refuses is refused to the guest (memory.grow -1), and
// the meter counts only what was given.
func TestMeteredMemoryWhenTheSystemRefuses(t *testing.T) {
	t.Parallel()
	meter := &memoryMeter{budget: 1 << 30}
	refused := &panicMemory{}
	mem := &meteredMemory{meter: meter, mem: refused, max: 1 << 20}
	b := mem.Reallocate(64 << 10)
	require.Len(t, b, 64<<10)
	require.True(t, refused.freed)
	require.IsType(t, &sliceMemory{}, mem.mem)
	require.Len(t, mem.Reallocate(128<<10), 128<<10, "the slice grows")
	require.EqualValues(t, 128<<10, meter.used.Load())

	mem.mem = &panicMemory{}
	require.Nil(t, mem.Reallocate(256<<10), "a growth the system refuses is refused")
	require.EqualValues(t, 128<<10, meter.used.Load(), "and not counted")
	mem.Free()
	require.Zero(t, meter.used.Load())
}
