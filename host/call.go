package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"

	extism "github.com/extism/go-sdk"

	"github.com/proteanhq/protean-host/abi"
)

// CallError is a protean_handle call that failed as a whole: the module
// trapped, returned non-zero, ran past its deadline, or wrote output the
// host cannot use. No result of the batch is committed.
type CallError struct {
	File    string
	Handler string
	Err     error
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
)

// pool keeps idle instances of one module. Instances are not safe for
// concurrent use, so each call takes one; at most size exist at once.
type pool struct {
	idle chan *extism.Plugin
	sem  chan struct{}
}

func newPool(size int) *pool {
	if size <= 0 {
		size = runtime.GOMAXPROCS(0)
	}
	return &pool{idle: make(chan *extism.Plugin, size), sem: make(chan struct{}, size)}
}

// Handle runs handler on a batch of messages in a pooled instance, under
// the module's deadline, with s answering the guest's host-function calls.
// It returns one result per handled message (possibly fewer, ending with an
// error), or a *CallError.
func (m *Module) Handle(ctx context.Context, handler string, msgs []abi.Envelope, s Session) ([]abi.Result, error) {
	fail := func(err error) ([]abi.Result, error) {
		return nil, &CallError{File: m.File, Handler: handler, Err: err}
	}
	in, err := json.Marshal(abi.HandleRequest{Handler: handler, Messages: msgs})
	if err != nil {
		return fail(err)
	}
	inst, err := m.acquire(ctx)
	if err != nil {
		return fail(err)
	}
	callCtx, cancel := context.WithTimeout(WithSession(ctx, s), m.Limits.Timeout)
	defer cancel()
	rc, out, err := inst.CallWithContext(callCtx, abi.ExportHandle, in)
	switch {
	case ctx.Err() != nil:
		m.discard(inst)
		return fail(fmt.Errorf("%w: %v", ErrCanceled, ctx.Err()))
	case callCtx.Err() != nil && !m.Limits.Uninterruptible:
		m.discard(inst)
		return fail(fmt.Errorf("%w (limit %s)", ErrTimeout, m.Limits.Timeout))
	case err != nil || rc != 0:
		// Either way the instance's state is suspect: replace it.
		m.discard(inst)
		// A trap (out of memory, stack overflow, unreachable) comes from
		// wazero, whose trap errors read "wasm error: …" (the type is
		// internal to wazero, so the text is the only mark); anything else
		// is a failure the guest reported with error_set and a non-zero
		// return, which Extism hands back as the error.
		if err != nil && strings.HasPrefix(err.Error(), "wasm error:") {
			return fail(fmt.Errorf("%w: %v", ErrTrap, err))
		}
		msg := fmt.Sprint(err)
		if err == nil {
			msg = inst.GetError()
		}
		return fail(fmt.Errorf("%w (code %d): %s", ErrFailed, rc, msg))
	}
	m.release(inst)
	resp, err := abi.DecodeHandleResponse(out, len(msgs), m.Limits.MaxOutputBytes)
	if err != nil {
		return fail(fmt.Errorf("%w: %v", ErrOutput, err))
	}
	return resp.Results, nil
}

func (m *Module) acquire(ctx context.Context) (*extism.Plugin, error) {
	select {
	case inst := <-m.pool.idle:
		return inst, nil
	default:
	}
	select {
	case inst := <-m.pool.idle:
		return inst, nil
	case m.pool.sem <- struct{}{}:
		inst, err := m.instance(ctx, m.log)
		if err != nil {
			<-m.pool.sem
			return nil, err
		}
		return inst, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for an instance: %v", ErrCanceled, ctx.Err())
	}
}

func (m *Module) release(inst *extism.Plugin) {
	select {
	case m.pool.idle <- inst:
	default: // cannot happen: idle holds as many as sem admits
		m.discard(inst)
	}
}

func (m *Module) discard(inst *extism.Plugin) {
	_ = inst.Close(context.Background())
	<-m.pool.sem
}

// closeInstances closes the idle instances; calls in flight close theirs
// when they finish.
func (p *pool) closeIdle(ctx context.Context) {
	for {
		select {
		case inst := <-p.idle:
			_ = inst.Close(ctx)
			<-p.sem
		default:
			return
		}
	}
}
