package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/sys"

	"github.com/proteanhq/protean-host/abi"
)

// CallError is a protean_handle call that failed as a whole: the module
// trapped, returned non-zero, ran past its deadline, or wrote output the
// host cannot use. No result of the batch is committed.
type CallError struct {
	File    string
	Handler string
	Err     error
	// Waited is how much of the call's deadline went by before the guest
	// ran: waiting for a free instance and creating one. A call that ran
	// out of time mostly waiting ran out of the host's time, not its own.
	Waited time.Duration
}

func (e *CallError) Error() string {
	return fmt.Sprintf("plugin %s: handler %s: %v", e.File, e.Handler, e.Err)
}

// Unwrap returns the cause.
func (e *CallError) Unwrap() error { return e.Err }

// Causes of a CallError.
var (
	ErrTimeout  = errors.New("call exceeded its deadline")
	ErrTrap     = errors.New("module trapped")
	ErrFailed   = errors.New("module reported failure")
	ErrOutput   = errors.New("unusable output")
	ErrCanceled = errors.New("call canceled")
	// ErrNoInstance: every instance of the module stayed busy for the
	// whole of the call's deadline.
	ErrNoInstance = errors.New("no instance free within the call's deadline")
	// ErrNotReady: the module's code was still being compiled (after a
	// start, or a release) when the call's deadline ended; the compile
	// goes on, and a later call finds the code. A call that fails so
	// also matches ErrTimeout.
	ErrNotReady = errors.New("module not ready: its code is still compiling")
)

// TrapError is a call the runtime stopped: a WebAssembly trap
// (unreachable, which is how a Go guest aborts on out-of-memory or a stack
// overflow; out-of-bounds memory access; the runtime's own stack overflow;
// …) or the module exiting through WASI proc_exit with a non-zero code. It
// matches ErrTrap under errors.Is.
type TrapError struct {
	// Reason is wazero's name for the trap ("unreachable", "out of bounds
	// memory access", "stack overflow", …), or "exit" for proc_exit.
	Reason string
	// ExitCode is proc_exit's code when Reason is "exit".
	ExitCode uint32
	Err      error
}

func (e *TrapError) Error() string { return fmt.Sprintf("%v: %s: %v", ErrTrap, e.Reason, e.Err) }

// Unwrap returns wazero's error.
func (e *TrapError) Unwrap() error { return e.Err }

// Is makes a TrapError match ErrTrap.
func (e *TrapError) Is(target error) bool { return target == ErrTrap }

// TrapExit is TrapError.Reason for a module that exited with proc_exit.
const TrapExit = "exit"

// wasmRuntimeError is the type wazero wraps every trap in
// (internal/wasmruntime.Error, one value per trap kind). Being internal to
// wazero it cannot be named here, so it is recognised by its package path
// and name; TestTrapsAreClassifiedByType pins them against the wazero in
// go.mod (its oom, stack and oob cases are such traps),
// so an upgrade that moves the type fails a test instead of silently
// turning traps into guest failures.
const (
	wasmRuntimePkg  = "github.com/tetratelabs/wazero/internal/wasmruntime"
	wasmRuntimeType = "Error"
)

// trapOf classifies a call's error by type: a *TrapError for a trap or a
// proc_exit, nil for anything else (a failure the guest reported).
func trapOf(err error) *TrapError {
	if err == nil {
		return nil
	}
	var exit *sys.ExitError
	if errors.As(err, &exit) {
		return &TrapError{Reason: TrapExit, ExitCode: exit.ExitCode(), Err: err}
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if isWasmRuntimeError(e) {
			return &TrapError{Reason: e.Error(), Err: err}
		}
	}
	return nil
}

func isWasmRuntimeError(err error) bool {
	t := reflect.TypeOf(err)
	if t.Kind() != reflect.Pointer {
		return false
	}
	t = t.Elem()
	return t.PkgPath() == wasmRuntimePkg && t.Name() == wasmRuntimeType
}

// pool keeps idle instances of one module. Instances are not safe for
// concurrent use, so each call takes one; at most size exist at once.
//
// The idle instances are a stack: a call takes the most recently used
// one, so under a load that needs fewer instances than were made the
// others stay at the bottom, age past Limits.InstanceIdle and are closed
// (reapIdle). A queue would hand each in turn to the next call, and none
// would ever age.
type pool struct {
	// sem holds a slot for each call that holds, or is making, an
	// instance: its capacity caps the instances, and a call waits on it
	// when all are busy. An idle instance holds no slot.
	sem chan struct{}
	now func() time.Time

	mu     sync.Mutex
	idle   []idleInstance // oldest first; the last is the most recently used
	live   int            // instances made or being made, and not closed: the busy and the idle
	closed bool           // the module was closed: an instance given back is closed
	// compiled is the module's code, nil once released (or closed);
	// loading is the compile that brings released code back, if one
	// runs; used is when a call last took an instance (codeidle.go).
	compiled *compiledCode
	loading  *codeLoad
	used     time.Time
	// reaping counts reapIdle's closes in progress, which closeIdle waits
	// for: no instance is closed after its module.
	reaping sync.WaitGroup

	// created and discarded count the instances made, and those thrown
	// away (by reason: see Discard reasons), since the module loaded.
	created   atomic.Int64
	discarded [discardReasons]atomic.Int64
	// codeReleased and codeLoads count the releases of the module's
	// compiled code and its compiles after one.
	codeReleased, codeLoads atomic.Int64
	// calls and ranNanos count the guest calls that ran in an instance
	// and the wall time they ran; meters are the memory meters of the
	// live instances, busy or idle (under mu). tenantstats.go reads them.
	calls, ranNanos atomic.Int64
	meters          map[*memoryMeter]struct{}
}

// idleInstance is an instance in the pool and when it was put there.
type idleInstance struct {
	inst  *instance
	since time.Time
}

// Why an instance is thrown away rather than put back (InstanceStats).
const (
	discardFailed = iota // a call on it failed: its state is suspect
	discardMemory        // its memories grew past recycle_above_mb
	discardExited        // the guest exited (WASI proc_exit)
	discardIdle          // it sat idle longer than instance_idle_ms
	discardReasons
)

var discardNames = [discardReasons]string{"failed", "memory", "exited", "idle"}

// InstanceStats are a module's instances: how many it may have (Max,
// max_instances), have (Live), and sit idle (Idle); how many were made
// since the module loaded, and how many thrown away, by reason: "failed"
// (a call failed, its state suspect), "memory" (over recycle_above_mb),
// "exited" (the guest exited), "idle" (unused for instance_idle_ms, its
// memory given back). Instances made over and over are guest start-up
// and heap growth paid again: a reason to look at (for "idle", a reason
// to raise instance_idle_ms if the first calls after a pause are slow).
// CodeReleased counts the releases of the module's compiled code
// (code_idle_ms) and CodeLoads its compiles after one; CodeLoaded says
// whether it is in memory now.
type InstanceStats struct {
	Max          int              `json:"max"`
	Live         int              `json:"live"`
	Idle         int              `json:"idle"`
	Created      int64            `json:"created"`
	Discarded    map[string]int64 `json:"discarded"`
	CodeLoaded   bool             `json:"code_loaded"`
	CodeReleased int64            `json:"code_released"`
	CodeLoads    int64            `json:"code_loads"`
}

// Instances reads the module's instance counts.
func (m *Module) Instances() InstanceStats {
	m.pool.mu.Lock()
	live, idle, loaded := m.pool.live, len(m.pool.idle), m.pool.compiled != nil
	m.pool.mu.Unlock()
	st := InstanceStats{Max: cap(m.pool.sem), Live: live, Idle: idle, Created: m.pool.created.Load(),
		Discarded: make(map[string]int64, discardReasons), CodeLoaded: loaded,
		CodeReleased: m.pool.codeReleased.Load(), CodeLoads: m.pool.codeLoads.Load()}
	for i := range discardReasons {
		st.Discarded[discardNames[i]] = m.pool.discarded[i].Load()
	}
	return st
}

func newPool(size int, now func() time.Time) *pool {
	if size <= 0 {
		size = runtime.GOMAXPROCS(0)
	}
	return &pool{sem: make(chan struct{}, size), now: now, used: now()}
}

// Handle runs handler on a batch of messages in a pooled instance, under
// the module's deadline, with s answering the guest's host-function calls.
// It returns one result per handled message (possibly fewer, ending with an
// error), or a *CallError.
func (m *Module) Handle(ctx context.Context, handler string, msgs []abi.Envelope, s Session) ([]abi.Result, error) {
	var waited time.Duration
	fail := func(err error) ([]abi.Result, error) {
		return nil, &CallError{File: m.File, Handler: handler, Err: err, Waited: waited}
	}
	var (
		in  []byte
		v2  *callV2 // set for a module of ABI v2 (abiv2.go)
		err error
	)
	budget := &callBudget{lim: m.Limits}
	sessCtx := withBudget(withSession(ctx, s), budget)
	if m.Manifest != nil && m.Manifest.ABIVersion >= 2 {
		sessCtx, v2 = m.handleV2(sessCtx, handler, msgs, s)
	} else if in, err = json.Marshal(abi.HandleRequest{Handler: handler, Messages: msgs}); err != nil {
		return fail(err)
	}
	// The deadline covers the whole call: waiting for a free instance,
	// creating one, and running the guest.
	start := time.Now()
	callCtx, cancel := context.WithTimeout(sessCtx, m.Limits.Timeout)
	defer cancel()
	// The tenant's share of the guest slots first (fairshare.go).
	if err := m.admit(callCtx, ctx); err != nil {
		waited = time.Since(start)
		return fail(err)
	}
	// The slot goes back as soon as the guest has returned: closing a
	// failed instance is no guest work, and a call queued for the slot
	// has the same deadline as this one had.
	holdsSlot := true
	defer func() {
		if holdsSlot {
			m.share.Done()
		}
	}()
	inst, err := m.acquire(callCtx, ctx)
	waited = time.Since(start)
	if err != nil {
		return fail(err)
	}
	var (
		rc  uint32
		out []byte
	)
	budget.meter, budget.inst = inst.mem, inst
	release := inst.guard(callCtx, m.share)
	entered := time.Now()
	if v2 != nil {
		rc, err = m.callV2(callCtx, inst.Plugin, v2)
	} else {
		rc, out, err = inst.CallWithContext(callCtx, abi.ExportHandle, in)
	}
	m.ran(time.Since(entered))
	raised := release()
	budget.release()
	holdsSlot = false
	m.share.Done()
	if cerr := m.callFailure(ctx, callCtx, inst, raised, v2, rc, err); cerr != nil {
		// Whatever failed, the instance's state is suspect: replace it.
		m.discard(inst, discardFailed)
		return fail(cerr)
	}
	if v2 != nil {
		res, err := v2.resultsOrFail(fail, len(msgs))
		if err != nil {
			m.discard(inst, discardFailed)
			return res, err
		}
		m.recycle(ctx, inst)
		return res, nil
	}
	resp, err := abi.DecodeHandleResponse(out, len(msgs), m.Limits.MaxOutputBytes)
	if err != nil {
		// An instance that exited (proc_exit(0)) answers no output.
		m.discard(inst, discardFailed)
		return fail(fmt.Errorf("%w: %w", ErrOutput, err))
	}
	m.recycle(ctx, inst)
	return resp.Results, nil
}

// callFailure is why a guest call failed, nil if it did not: the
// caller's cancellation (ctx), the deadline (the host's stop flag raised,
// or callCtx ended), the guest's memory or host-call budget, a bad ABI v2
// output, a trap, or a failure the guest reported (rc != 0).
func (m *Module) callFailure(ctx, callCtx context.Context, inst *instance, raised bool, v2 *callV2, rc uint32, err error) error {
	var (
		memErr   *GuestMemoryError
		limitErr *HostLimitError
	)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %v", ErrCanceled, ctx.Err())
	case raised || callCtx.Err() != nil && !m.Limits.Uninterruptible:
		// The guest stopped at the stop flag the host raised (a trap the
		// host caused, not the guest's), or ran past its deadline anyway.
		return fmt.Errorf("%w (limit %s)", ErrTimeout, m.Limits.Timeout)
	case errors.As(err, &memErr):
		return memErr
	case errors.As(err, &limitErr):
		return limitErr
	case v2 != nil && v2.outErr != nil:
		return fmt.Errorf("%w: %v", ErrOutput, v2.outErr)
	case err != nil || rc != 0:
		// A trap is recognised by the type of the error wazero returns
		// (see trapOf); anything else is a failure the guest reported
		// with error_set and a non-zero return, which Extism hands back
		// as the error.
		if t := trapOf(err); t != nil {
			return t
		}
		msg := fmt.Sprint(err)
		if err == nil {
			msg = inst.GetError()
		}
		if err == nil && v2 != nil && v2.errMsg != "" {
			msg = v2.errMsg
		}
		return fmt.Errorf("%w (code %d): %s", ErrFailed, rc, msg)
	}
	return nil
}

// acquire takes the most recently used idle instance or creates one,
// within callCtx (the call's deadline): a module whose instances are all
// busy makes its callers wait at most their deadline, then fail with
// ErrNoInstance. ctx is the caller's own context, to tell a cancellation
// from the deadline.
func (m *Module) acquire(callCtx, ctx context.Context) (*instance, error) {
	select {
	case m.pool.sem <- struct{}{}:
	default:
		select {
		case m.pool.sem <- struct{}{}:
		case <-callCtx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: waiting for an instance: %v", ErrCanceled, ctx.Err())
			}
			return nil, fmt.Errorf("%w: all %d instances busy (limit %s)", ErrNoInstance, cap(m.pool.sem), m.Limits.Timeout)
		}
	}
	if inst := m.pool.pop(); inst != nil {
		return inst, nil
	}
	c, err := m.code(callCtx, ctx)
	if err != nil {
		<-m.pool.sem
		return nil, err
	}
	inst, err := m.instance(callCtx, c, m.log)
	if err != nil {
		m.pool.mu.Lock()
		m.pool.live--
		m.pool.mu.Unlock()
		<-m.pool.sem
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: creating an instance: %v", ErrCanceled, ctx.Err())
		case callCtx.Err() != nil:
			return nil, fmt.Errorf("%w: creating an instance (limit %s): %v", ErrTimeout, m.Limits.Timeout, err)
		}
		return nil, err
	}
	m.pool.created.Add(1)
	m.pool.metered(inst.mem, true)
	return inst, nil
}

// pop takes the most recently used idle instance, nil if none is idle.
// What pop returns the reaper no longer sees, and what the reaper took
// pop no longer sees: a call never gets an instance being closed.
func (p *pool) pop() *instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used = p.now()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	inst := p.idle[n-1].inst
	p.idle[n-1] = idleInstance{}
	p.idle = p.idle[:n-1]
	return inst
}

// release puts an instance back on top of the idle stack (or closes it,
// if the module was closed during the call) and frees the call's slot.
func (m *Module) release(inst *instance) {
	p := m.pool
	p.mu.Lock()
	if p.closed {
		p.live--
		p.mu.Unlock()
		m.closeInstance(inst)
	} else {
		p.idle = append(p.idle, idleInstance{inst: inst, since: p.now()})
		p.mu.Unlock()
	}
	<-p.sem
}

// discard closes the instance of a call, counting why, and frees the
// call's slot.
func (m *Module) discard(inst *instance, why int) {
	m.pool.discarded[why].Add(1)
	m.pool.mu.Lock()
	m.pool.live--
	m.pool.mu.Unlock()
	m.closeInstance(inst)
	<-m.pool.sem
}

func (m *Module) closeInstance(inst *instance) {
	m.v2.Delete(inst.Plugin)
	_ = inst.Close(context.Background())
	m.pool.metered(inst.mem, false)
}

// reapIdle closes the instances idle for longer than the module's
// InstanceIdle at now (none if it is not positive), and returns how many
// it closed. The stack is oldest first, so they are a prefix of it.
func (m *Module) reapIdle(now time.Time) int {
	limit := m.Limits.InstanceIdle
	if limit <= 0 {
		return 0
	}
	p := m.pool
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0
	}
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].since) >= limit {
		n++
	}
	if n == 0 {
		p.mu.Unlock()
		return 0
	}
	old := make([]*instance, n)
	for i := range old {
		old[i] = p.idle[i].inst
	}
	p.idle = slices.Delete(p.idle, 0, n)
	p.live -= n
	p.reaping.Add(1)
	p.mu.Unlock()
	defer p.reaping.Done()
	for _, inst := range old {
		p.discarded[discardIdle].Add(1)
		m.closeInstance(inst)
	}
	return n
}

// closeIdle closes the idle instances and marks the pool closed: calls in
// flight close theirs when they finish. It returns the module's code, for
// the caller to close (nil if released).
func (p *pool) closeIdle(ctx context.Context) *compiledCode {
	p.mu.Lock()
	p.closed = true
	c := p.compiled
	p.compiled = nil
	idle := p.idle
	p.idle = nil
	p.live -= len(idle)
	p.mu.Unlock()
	for _, in := range idle {
		_ = in.inst.Close(ctx)
		p.metered(in.inst.mem, false)
	}
	p.reaping.Wait()
	return c
}
