package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/experimental"

	"github.com/proteanhq/protean-host/internal/instrument"
)

// Sentinel causes of a LoadError for a module over a sandbox limit.
var (
	// ErrModuleTooLarge: the file is larger than max_module_bytes.
	ErrModuleTooLarge = errors.New("module file exceeds max_module_bytes")
	// ErrTableLimit: a table's declared size is over max_table_elements.
	ErrTableLimit = instrument.ErrTableLimit
	// ErrCompileTimeout: compiling the module took longer than
	// compile_timeout_ms.
	ErrCompileTimeout = errors.New("compilation did not finish in time")
	// ErrShapeLimit: the module's shape (functions, body size, locals,
	// nesting) is over a limit, so it is refused before compiling; the
	// error's message names the function and the limit.
	ErrShapeLimit = instrument.ErrLimit
)

// boundTables bounds every table the module defines to limit elements
// (instrument.BoundTables): over the limit is ErrTableLimit, unparsable is
// ErrNotWASM. A module of another binary version is left as it is, for
// wazero to refuse.
func boundTables(b []byte, limit int) ([]byte, error) {
	out, err := instrument.BoundTables(b, uint32(min(limit, math.MaxUint32)))
	switch {
	case errors.Is(err, instrument.ErrMalformed):
		return nil, fmt.Errorf("%w: %v", ErrNotWASM, err)
	case errors.Is(err, instrument.ErrUnsupported):
		return b, nil
	}
	return out, err
}

// abandonedCompiles counts compilations that ran past their deadline and
// were left to finish in the background (wazero's compiler cannot be
// interrupted); their result is closed when they do.
var abandonedCompiles atomic.Int64

// AbandonedCompiles returns how many compilations are still running past
// their deadline.
func AbandonedCompiles() int64 { return abandonedCompiles.Load() }

// within runs compile off the caller's goroutine and waits for it at most
// limit, or until ctx ends: a compile bomb is refused at load, and a
// reload being compiled never holds up a shutdown. A compilation left
// behind finishes in the background (it cannot be interrupted) and its
// result is released by closeLate.
func within[T any](ctx context.Context, limit time.Duration, compile func() (T, error), closeLate func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		v, err := compile()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			if err == nil {
				closeLate(v)
			}
			abandonedCompiles.Add(-1)
			return
		}
		done <- result{v, err}
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var zero T
	var cause error
	select {
	case r := <-done:
		return r.v, r.err
	case <-timer.C:
		cause = fmt.Errorf("%w (limit %s)", ErrCompileTimeout, limit)
	case <-ctx.Done():
		cause = fmt.Errorf("%w: compiling: %v", ErrCanceled, ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-done: // finished as the wait ended: use it
		return r.v, r.err
	default:
	}
	abandoned = true
	abandonedCompiles.Add(1)
	return zero, cause
}

// memoryMeter counts the bytes of every linear memory of one instance (the
// module's and the Extism kernel's, whose memory holds inputs and outputs),
// through wazero's allocator hook, and refuses a growth that would take
// the instance past budget: memory_mb bounds each memory, the meter bounds
// their sum, kernel memory included.
type memoryMeter struct {
	budget uint64
	used   atomic.Uint64
	peak   atomic.Uint64
}

// Allocate implements experimental.MemoryAllocator.
func (m *memoryMeter) Allocate(capacity, maximum uint64) experimental.LinearMemory {
	return &meteredMemory{meter: m, max: maximum}
}

type meteredMemory struct {
	meter *memoryMeter
	buf   []byte
	max   uint64
}

// Reallocate grows the memory to size bytes, or returns nil (memory.grow
// then returns -1 to the guest) when that would exceed the instance's
// budget.
func (l *meteredMemory) Reallocate(size uint64) []byte {
	cur := uint64(len(l.buf))
	if size > cur {
		grow := size - cur
		// The first allocation (the declared minimum) is never refused:
		// wazero cannot handle a failure there; the runtime's page limit
		// bounds it.
		if used := l.meter.used.Add(grow); used > l.meter.budget && l.buf != nil {
			l.meter.used.Add(-grow)
			return nil
		} else if used > l.meter.peak.Load() {
			l.meter.peak.Store(used)
		}
	} else {
		l.meter.used.Add(-(cur - size))
	}
	if size <= uint64(cap(l.buf)) {
		l.buf = l.buf[:size]
		return l.buf
	}
	// Reserve ahead like append, within the memory's maximum, so a guest
	// growing page by page does not copy its heap each time.
	c := max(size, min(2*uint64(cap(l.buf)), l.max))
	nb := make([]byte, size, c)
	copy(nb, l.buf)
	l.buf = nb
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *meteredMemory) Free() {
	l.meter.used.Add(-uint64(len(l.buf)))
	l.buf = nil
}

// logLimiter passes at most burst guest log lines per module at once,
// refilled at rate lines per second, and counts what it drops, so a guest
// cannot flood the host's log.
type logLimiter struct {
	mu      sync.Mutex
	tokens  float64
	last    time.Time
	rate    float64
	burst   float64
	dropped int64
}

func newLogLimiter(rate, burst float64) *logLimiter {
	return &logLimiter{tokens: burst, rate: rate, burst: burst}
}

// allow reports whether a line may be logged now, and how many were
// dropped since the last line that was.
func (l *logLimiter) allow(now time.Time) (bool, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
	if l.tokens < 1 {
		l.dropped++
		return false, 0
	}
	l.tokens--
	d := l.dropped
	l.dropped = 0
	return true, d
}

// guestLog forwards one guest log line (either ABI) to the host log, within
// the module's rate.
func (m *Module) guestLog(ctx context.Context, level slog.Level, msg string) {
	m.logLine(m.log, ctx, level, msg)
}

func (m *Module) logLine(log *slog.Logger, ctx context.Context, level slog.Level, msg string) {
	if !log.Enabled(ctx, level) {
		return // not printed, so not counted against the module's rate
	}
	ok, dropped := m.logs.allow(time.Now())
	if !ok {
		return
	}
	if dropped > 0 {
		log.Warn("guest log lines dropped (over the module's log rate)", "module", m.File, "dropped", dropped)
	}
	log.Log(ctx, level, msg, "module", m.File)
}

// recycle puts an instance back in the pool after a successful call,
// unless it must not serve another: it exited (WASI proc_exit with code 0
// closes the module without an error, and its next call would fail), or
// its memories grew past RecycleAboveMB.
func (m *Module) recycle(ctx context.Context, inst *instance) {
	if inst.exited(ctx) {
		m.log.Warn("instance exited during its call; not reused", "module", m.File)
		m.discard(inst, discardExited)
		return
	}
	if used := inst.mem.used.Load(); used > uint64(m.Limits.RecycleAboveMB)<<20 {
		m.log.Debug("instance recycled: memory over the high-water mark", "module", m.File,
			"memory_bytes", used, "recycle_above_mb", m.Limits.RecycleAboveMB)
		m.discard(inst, discardMemory)
		return
	}
	m.release(inst)
}

// exited reports whether the instance's module has closed (WASI proc_exit).
// It asks the module itself (found once, see mainModule); should Extism
// ever hide it, calling no function answers "module is closed" for an
// exited instance and "unknown function" otherwise, without running guest
// code, at ~10 us a call.
func (in *instance) exited(ctx context.Context) bool {
	if in.main == nil && !in.noMain {
		main, err := mainModule(in.Plugin)
		in.main, in.noMain = main, err != nil
	}
	if in.main != nil {
		return in.main.IsClosed()
	}
	_, _, err := in.CallWithContext(context.WithoutCancel(ctx), "", nil)
	return err != nil && err.Error() == "module is closed"
}
