package host

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero/api"

	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/wasmbin"
)

// Deadline modes a module runs under (Module.Deadline).
const (
	// DeadlineInstrumented: the module was rewritten at load with a stop
	// flag checked at every loop header and call (package instrument);
	// the host raises the flag when a call's deadline passes or its
	// context is cancelled. The default.
	DeadlineInstrumented = "instrumented"
	// DeadlineRuntime: wazero's close-on-context-done, for a module the
	// rewriter refused; as safe, several times slower in loops.
	DeadlineRuntime = "runtime"
	// DeadlineOff: [plugins.limits] interruptible = false; nothing stops
	// a runaway call.
	DeadlineOff = "off"
)

// runtimeMarker is appended, as a custom section, to a module compiled
// with close-on-context-done. wazero's compilation cache is keyed by the
// module's bytes alone, not by whether the code was compiled with the
// termination checks, so the same bytes compiled both ways (one tenant
// trusted, another not) would share one entry and one of them would run
// the other's code. Distinct bytes per mode give distinct keys; the
// instrumented bytes carry instrument.CustomSection with its version.
var runtimeMarker = wasmbin.AppendCustom(nil, "protean.deadline", []byte("runtime"))

// prepare returns the bytes to compile for a module under lim and the
// deadline mode they run in. A module over a shape limit or malformed is
// refused; one the rewriter does not support falls back to wazero's
// close-on-context-done (logged): still safe, only slower.
func prepare(file string, b []byte, lim Limits, log interface {
	Warn(msg string, args ...any)
}) (code []byte, mode string, hasStart bool, err error) {
	if lim.Uninterruptible || lim.RuntimeDeadline {
		// Not instrumented, but its shape is checked all the same.
		if err := instrument.Check(b, lim.shape()); errors.Is(err, instrument.ErrLimit) {
			return nil, "", false, err
		} else if errors.Is(err, instrument.ErrMalformed) {
			return nil, "", false, fmt.Errorf("%w: %v", ErrNotWASM, err)
		}
		if lim.Uninterruptible {
			return b, DeadlineOff, false, nil
		}
		return append(b[:len(b):len(b)], runtimeMarker...), DeadlineRuntime, false, nil
	}
	res, err := instrument.Module(b, lim.shape())
	if errors.Is(err, instrument.ErrLimit) {
		return nil, "", false, err
	}
	if errors.Is(err, instrument.ErrMalformed) {
		// Refused, not handed to wazero, whose decoder trusts the counts
		// it reads (see instrument's checkCount).
		return nil, "", false, fmt.Errorf("%w: %v", ErrNotWASM, err)
	}
	if err != nil {
		log.Warn("module not instrumented; its deadline falls back to the runtime's, several times slower in loops",
			"module", file, "err", err)
		return append(b[:len(b):len(b)], runtimeMarker...), DeadlineRuntime, false, nil
	}
	return res.Bytes, DeadlineInstrumented, res.HasStart, nil
}

// instance is one instantiated module. Instances are not goroutine-safe:
// one call at a time.
type instance struct {
	*extism.Plugin
	// fuel is the instrumented module's fuel global (nil otherwise): the
	// guest counts it down at every check and calls yield at 0.
	fuel api.MutableGlobal

	// mu orders the writes to fuel of the guest's goroutine (yield) and
	// of the goroutine that stops a call (guard): wazero's globals are
	// plain memory.
	mu       sync.Mutex
	stopped  bool  // the current call is to stop; fuel stays at 0
	deadline int64 // the current call's deadline, Unix ns; 0: none
	// slice is when the current call began or last yielded its core
	// (Unix ns; yield), read and written by the guest's goroutine only.
	slice int64
	// share is the current call's tenant's share, whose scheduler's turns
	// at the cores its long calls take (cores.go; nil: none, they yield
	// with Gosched), and onCore whether the call holds one; the guest's
	// goroutine's only.
	share  *Share
	onCore bool
	// yields counts the current call's calls into yield: a call that has
	// made longYields of them has done that much guest work, whatever its
	// wall time (the guest's goroutine's only).
	yields int
	// mem meters the instance's memories (see memoryMeter).
	mem *memoryMeter
	// main is the module's own instance, once looked up (see exited);
	// noMain: the lookup failed.
	main   api.Module
	noMain bool
}

// yield is the instance's sched_yield (wazero's osyield hook), which an
// instrumented guest calls every instrument.Period checks and a Go guest
// also calls on its own. It stops the call (leaves the fuel at 0, so the
// guest traps right after) once the call is to stop or its deadline has
// passed, and refills the fuel otherwise. Checking the deadline here, on
// the guest's own goroutine, matters: guest code cannot be preempted, so
// with every P running a guest no timer goroutine would get to run; and
// this Go call is where the scheduler can preempt the guest's goroutine
// (for the timer, other goroutines, a GC).
//
// It is also where a long call hands its core over: Go preempts a
// goroutine that has run 10 ms, far longer than a quiet tenant's whole
// call, so with every P running a CPU-bound guest another tenant's call
// waited up to 10 ms for each step of its way (the HTTP read, the guest
// call, the commit, the answer). A call that has run timeSlice since it
// began or last yielded goes to the back of the run queue (runtime.Gosched),
// so a runnable goroutine waits at most about one slice per busy P. With
// nothing else runnable Gosched returns at once.
func (inst *instance) yield() {
	if inst.fuel == nil {
		return
	}
	now := time.Now().UnixNano()
	inst.mu.Lock()
	if !inst.stopped && inst.deadline != 0 && now >= inst.deadline {
		inst.stopped = true
	}
	if inst.stopped {
		inst.fuel.Set(0)
		inst.mu.Unlock()
		return
	}
	inst.fuel.Set(instrument.Period)
	deadline := inst.deadline
	inst.mu.Unlock()
	inst.yields++
	if now-inst.slice >= int64(timeSlice) {
		if inst.yields >= longYields {
			inst.onCore = inst.share.turn(inst.onCore, now, deadline)
		} else {
			runtime.Gosched()
		}
		inst.slice = time.Now().UnixNano()
	}
}

// offCore gives back the call's turn at the cores, if it holds one (a
// host call, the call's end).
func (inst *instance) offCore() {
	if inst.onCore {
		inst.onCore = false
		inst.share.releaseTurn()
	}
}

// timeSlice is how long a guest call runs before it lets other goroutines
// run (yield): a tenth of Go's own preemption interval, so a quiet call
// beside CPU-bound guests waits a few slices, not tens of milliseconds.
// A guest yields every instrument.Period checks, some tens of
// microseconds in a tight loop, so the slice is kept to within that.
const timeSlice = time.Millisecond

// longYields is how many times a call must have called yield, beside
// running a timeSlice, to count as long and take turns at the cores
// (cores.go): 16 x instrument.Period checks, a few hundred microseconds of
// guest code in loops at least. A short call that waited a slice for a
// core (a collection, another goroutine) is still short.
const longYields = 16

// guard arms the instance for a call under ctx: at ctx's deadline, or
// when ctx is cancelled, the guest stops at its next check (the goroutine
// context.AfterFunc runs sets the fuel to 0; should no goroutine get to
// run, yield sees the deadline within instrument.Period checks). The
// returned release ends the watch and reports whether the call was
// stopped: such an instance must be discarded (a trapped instance is
// dead). For a module that is not instrumented guard does nothing.
func (inst *instance) guard(ctx context.Context, sh *Share) (release func() (stopped bool)) {
	if inst.fuel == nil {
		return func() bool { return false }
	}
	inst.share = sh
	inst.mu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		inst.deadline = dl.UnixNano()
	}
	inst.mu.Unlock()
	inst.slice = time.Now().UnixNano()
	inst.yields = 0
	var done sync.WaitGroup
	done.Add(1)
	stop := context.AfterFunc(ctx, func() {
		defer done.Done()
		inst.mu.Lock()
		defer inst.mu.Unlock()
		inst.stopped = true
		inst.fuel.Set(0)
	})
	return func() bool {
		if !stop() {
			done.Wait() // let the setter finish before the instance is closed
		}
		inst.offCore()
		inst.share = nil
		inst.mu.Lock()
		defer inst.mu.Unlock()
		inst.deadline = 0
		return inst.stopped
	}
}

// attach finds the stop flag of a fresh instance of an instrumented
// module and, if the module had a start section, runs its start function
// under the call deadline (wazero would have run it inside instantiation,
// where nothing can stop it).
func (m *Module) attach(ctx context.Context, inst *instance) error {
	mod, err := mainModule(inst.Plugin) // abiv2.go
	if err != nil {
		return err
	}
	g, ok := mod.ExportedGlobal(instrument.FuelGlobal).(api.MutableGlobal)
	if !ok {
		return fmt.Errorf("instrumented module without a mutable %s", instrument.FuelGlobal)
	}
	inst.fuel = g
	if !m.hasStart {
		return nil
	}
	f := mod.ExportedFunction(instrument.StartExport)
	if f == nil {
		return fmt.Errorf("instrumented module without %s", instrument.StartExport)
	}
	sctx, cancel := context.WithTimeout(ctx, m.Limits.Timeout)
	defer cancel()
	release := inst.guard(sctx, m.share)
	_, err = f.Call(sctx)
	raised := release()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("start function: %w: %v", ErrCanceled, ctx.Err())
	case raised || sctx.Err() != nil:
		return fmt.Errorf("start function: %w (limit %s)", ErrTimeout, m.Limits.Timeout)
	case err != nil:
		if t := trapOf(err); t != nil {
			return fmt.Errorf("start function: %w", t)
		}
		return fmt.Errorf("start function: %w", err)
	}
	return nil
}
