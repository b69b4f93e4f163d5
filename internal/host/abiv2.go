package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"unsafe"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero/api"

	"github.com/proteanhq/protean-host/abi"
)

// ABI v2 on the host side (abi/v2.md): the input is copied into guest
// memory in one piece when the guest asks for it, the output is copied out
// in one piece after its length is checked against max_output_bytes, and
// the host functions read requests from and write answers into guest
// memory directly. All of it goes through wazero's bounds-checked
// api.Memory: a pointer outside the module's memory ends the call with a
// *GuestMemoryError, never touches host memory.

// ErrGuestMemory is the cause of a call whose module handed a v2 host
// function a pointer and length outside its linear memory.
var ErrGuestMemory = errors.New("guest memory access out of bounds")

// GuestMemoryError is a v2 host-function call with a pointer and length
// outside the module's memory. The call fails (the instance is
// discarded); it matches ErrGuestMemory under errors.Is.
type GuestMemoryError struct {
	// Function is the v2 host function, e.g. abi.V2Load.
	Function string
	Ptr, Len uint32
	// Size is the memory's size in bytes at the time.
	Size uint32
}

func (e *GuestMemoryError) Error() string {
	return fmt.Sprintf("%v: %s(ptr %d, len %d) with %d bytes of memory", ErrGuestMemory, e.Function, e.Ptr, e.Len, e.Size)
}

// Unwrap returns ErrGuestMemory.
func (e *GuestMemoryError) Unwrap() error { return ErrGuestMemory }

// callV2 is the state of one v2 protean_handle call, carried in its
// context to the v2 host functions.
type callV2 struct {
	mem   api.Memory // the guest's own linear memory
	in    []byte
	limit int
	// memCap is what memory_limit answers: the memory cap, or the
	// recycle mark if lower. A Go guest that sized its heap by the cap
	// alone (at 10x its live heap) never collected: it crossed the mark
	// every few dozen calls and paid a fresh instance, its runtime's
	// start and its heap regrown and copied (BenchmarkProjector, batch
	// 50: ~13% of the guest's CPU per event).
	memCap  int64
	session Session
	log     *slog.Logger
	module  string
	// guestLog, when set, takes the guest's log lines (the module's rate
	// limit; see Module.guestLog) instead of log.
	guestLog func(ctx context.Context, level slog.Level, msg string)

	out     []byte
	outErr  error
	errMsg  string
	pending []byte // a host-function answer that did not fit the guest's buffer
	scratch []byte
}

type callV2Key struct{}

func callV2From(ctx context.Context) *callV2 {
	c, _ := ctx.Value(callV2Key{}).(*callV2)
	return c
}

// handleV2 prepares a v2 call: the binary request and the context that
// carries it to the host functions.
func (m *Module) handleV2(ctx context.Context, handler string, msgs []abi.Envelope, s Session) (context.Context, *callV2) {
	c := &callV2{
		mem:      emptyMemory{}, // the instance's memory once one is acquired
		in:       abi.AppendHandleRequestV2(nil, &abi.HandleRequest{Handler: handler, Messages: msgs}),
		limit:    m.Limits.MaxOutputBytes,
		memCap:   int64(min(m.Limits.MemoryMB, m.Limits.RecycleAboveMB)) << 20,
		session:  s,
		log:      m.log,
		module:   m.File,
		guestLog: m.guestLog,
	}
	return context.WithValue(ctx, callV2Key{}, c), c
}

// manifestCallV2 prepares protean_manifest's call so that the module may
// write its manifest with the v2 output function (bounded by
// abi.MaxManifestBytes) as well as with Extism's output_set: a module
// that speaks only v2 needs no Extism import at all.
func manifestCallV2(ctx context.Context, inst *extism.Plugin) (context.Context, *callV2) {
	main, err := mainModule(inst)
	if err != nil {
		return ctx, nil
	}
	c := &callV2{mem: main.Memory(), limit: abi.MaxManifestBytes, log: slog.New(slog.DiscardHandler)}
	return context.WithValue(ctx, callV2Key{}, c), c
}

// resultsOrFail decodes what a v2 call left as its output.
func (c *callV2) resultsOrFail(fail func(error) ([]abi.Result, error), n int) ([]abi.Result, error) {
	resp, err := abi.DecodeHandleResponseV2(c.out, n, c.limit)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrOutput, err))
	}
	return resp.Results, nil
}

// guestSlice returns the guest's bytes at [ptr, ptr+n), or ends the call
// with a *GuestMemoryError.
func guestSlice(mem api.Memory, fn string, ptr, n uint32) []byte {
	b, ok := mem.Read(ptr, n)
	if !ok {
		panic(&GuestMemoryError{Function: fn, Ptr: ptr, Len: n, Size: mem.Size()})
	}
	return b
}

func guestWrite(mem api.Memory, fn string, ptr uint32, b []byte) {
	if !mem.Write(ptr, b) {
		panic(&GuestMemoryError{Function: fn, Ptr: ptr, Len: uint32(len(b)), Size: mem.Size()})
	}
}

var i32 = extism.ValueTypeI32

// hostFunctionV2 defines a v2 host function. Outside a v2 call (c nil) it
// gets no memory: the functions then answer without touching any.
func hostFunctionV2(name string, params, results []extism.ValueType,
	fn func(ctx context.Context, c *callV2, mem api.Memory, stack []uint64)) extism.HostFunction {
	f := extism.NewHostFunctionWithStack(name, func(ctx context.Context, _ *extism.CurrentPlugin, stack []uint64) {
		c := callV2From(ctx)
		var mem api.Memory = emptyMemory{}
		if c != nil {
			mem = c.mem
		}
		fn(ctx, c, mem, stack)
	}, params, results)
	f.SetNamespace(abi.HostNamespaceV2)
	return f
}

// HostFunctionsV2 returns the ABI v2 host functions (namespace
// abi.HostNamespaceV2). Loaders register them next to the v1 functions;
// they serve only v2 protean_handle calls (Module.Handle of a module whose
// manifest declares ABI v2), and answer outside one as abi.HostInvalid.
func HostFunctionsV2() []extism.HostFunction {
	return slices.Concat(hostFunctionsV2Call(), hostFunctionsV2Reads(), hostFunctionsV2Env())
}

// hostFunctionsV2Call returns the call's own v2 host functions: its
// input's length and bytes, its output and its error.
func hostFunctionsV2Call() []extism.HostFunction {
	return []extism.HostFunction{
		hostFunctionV2(abi.V2InputLength, nil, []extism.ValueType{i32},
			func(_ context.Context, c *callV2, _ api.Memory, stack []uint64) {
				n := 0
				if c != nil {
					n = len(c.in)
				}
				stack[0] = api.EncodeU32(uint32(n))
			}),
		hostFunctionV2(abi.V2InputRead, []extism.ValueType{i32}, nil,
			func(_ context.Context, c *callV2, mem api.Memory, stack []uint64) {
				if c != nil {
					guestWrite(mem, abi.V2InputRead, api.DecodeU32(stack[0]), c.in)
				}
			}),
		hostFunctionV2(abi.V2Output, []extism.ValueType{i32, i32}, []extism.ValueType{i32},
			func(_ context.Context, c *callV2, mem api.Memory, stack []uint64) {
				ptr, n := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
				stack[0] = 1
				if c == nil {
					return
				}
				// The limit is checked before anything is copied.
				if int64(n) > int64(c.limit) {
					c.outErr = fmt.Errorf("output of %d bytes exceeds the %d-byte limit (max_output_bytes)", n, c.limit)
					return
				}
				c.out = append(c.out[:0], guestSlice(mem, abi.V2Output, ptr, n)...)
				stack[0] = 0
			}),
		hostFunctionV2(abi.V2Error, []extism.ValueType{i32, i32}, nil,
			func(_ context.Context, c *callV2, mem api.Memory, stack []uint64) {
				if c != nil {
					c.errMsg = string(guestSlice(mem, abi.V2Error, api.DecodeU32(stack[0]), min(api.DecodeU32(stack[1]), abi.MaxLogBytes)))
				}
			}),
	}
}

// hostFunctionsV2Reads returns the v2 host functions that answer the
// guest's reads: Load, ReadStream, and Response for an answer that did not
// fit the guest's buffer.
func hostFunctionsV2Reads() []extism.HostFunction {
	return []extism.HostFunction{
		hostFunctionV2(abi.V2Load, []extism.ValueType{i32, i32, i32, i32}, []extism.ValueType{i32},
			func(ctx context.Context, c *callV2, mem api.Memory, stack []uint64) {
				serveV2(ctx, c, mem, abi.V2Load, stack, func(b []byte, reqErr error) []byte {
					var resp abi.LoadResponse
					if c == nil || c.session == nil {
						resp = abi.LoadResponse{Error: "host functions are available only while a message is handled", ErrorKind: abi.HostInvalid}
					} else if reqErr != nil {
						resp = abi.LoadResponse{Error: reqErr.Error(), ErrorKind: abi.HostInvalid}
					} else if req, err := abi.DecodeLoadRequestV2(b); err != nil {
						invalid(c.session, err)
						resp = abi.LoadResponse{Error: err.Error(), ErrorKind: abi.HostInvalid}
					} else {
						resp = c.session.Load(ctx, req)
					}
					return abi.AppendLoadResponseV2(scratch(c), &resp)
				})
			}),
		hostFunctionV2(abi.V2ReadStream, []extism.ValueType{i32, i32, i32, i32}, []extism.ValueType{i32},
			func(ctx context.Context, c *callV2, mem api.Memory, stack []uint64) {
				serveV2(ctx, c, mem, abi.V2ReadStream, stack, func(b []byte, reqErr error) []byte {
					var resp abi.ReadStreamResponse
					if c == nil || c.session == nil {
						resp = abi.ReadStreamResponse{Error: "host functions are available only while a message is handled", ErrorKind: abi.HostInvalid}
					} else if reqErr != nil {
						resp = abi.ReadStreamResponse{Error: reqErr.Error(), ErrorKind: abi.HostInvalid}
					} else if req, err := abi.DecodeReadStreamRequestV2(b); err != nil {
						invalid(c.session, err)
						resp = abi.ReadStreamResponse{Error: err.Error(), ErrorKind: abi.HostInvalid}
					} else {
						resp = c.session.ReadStream(ctx, req, budgetFrom(ctx).readBytes())
					}
					return abi.AppendReadStreamResponseV2(scratch(c), &resp)
				})
			}),
		hostFunctionV2(abi.V2Response, []extism.ValueType{i32, i32}, []extism.ValueType{i32},
			func(ctx context.Context, c *callV2, mem api.Memory, stack []uint64) {
				var pending []byte
				if c != nil {
					pending = c.pending
				}
				ptr, capacity := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
				if c != nil && uint32(len(pending)) <= capacity {
					guestWrite(mem, abi.V2Response, ptr, pending)
					c.pending = nil
					budgetFrom(ctx).release()
				}
				stack[0] = api.EncodeU32(uint32(len(pending)))
			}),
	}
}

// hostFunctionsV2Env returns the v2 host functions of the guest's
// environment: its memory limit and its log.
func hostFunctionsV2Env() []extism.HostFunction {
	return []extism.HostFunction{
		hostFunctionV2(abi.V2MemoryLimit, nil, []extism.ValueType{extism.ValueTypeI64},
			func(_ context.Context, c *callV2, _ api.Memory, stack []uint64) {
				stack[0] = 0
				if c != nil {
					stack[0] = api.EncodeI64(c.memCap)
				}
			}),
		hostFunctionV2(abi.V2Log, []extism.ValueType{i32, i32, i32}, nil,
			func(ctx context.Context, c *callV2, mem api.Memory, stack []uint64) {
				msg := guestSlice(mem, abi.V2Log, api.DecodeU32(stack[1]), min(api.DecodeU32(stack[2]), abi.MaxLogBytes))
				if c == nil {
					return
				}
				level := slog.LevelInfo
				switch api.DecodeU32(stack[0]) {
				case 0:
					level = slog.LevelDebug
				case 2:
					level = slog.LevelWarn
				case 3:
					level = slog.LevelError
				}
				if c.guestLog != nil {
					c.guestLog(ctx, level, string(msg))
					return
				}
				c.log.Log(ctx, level, string(msg), "module", c.module)
			}),
	}
}

func scratch(c *callV2) []byte {
	if c == nil {
		return nil
	}
	return c.scratch[:0]
}

// serveV2 reads a request at (stack[0], stack[1]) bounded by
// abi.MaxHostRequestBytes, answers it, and writes the answer to the
// guest's buffer (stack[2], stack[3]) if it fits, keeping it for
// V2Response otherwise. It returns the answer's length. The call's budget
// (budget.go) counts the call and the answer, and holds a kept answer
// against the instance's memory until the guest takes it.
func serveV2(ctx context.Context, c *callV2, mem api.Memory, fn string, stack []uint64, serve func([]byte, error) []byte) {
	ptr, n := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	buf, capacity := api.DecodeU32(stack[2]), api.DecodeU32(stack[3])
	b := budgetFrom(ctx)
	var late error
	if c != nil && c.session != nil {
		late = b.enter(ctx, fn)
	}
	var out []byte
	switch {
	case late != nil:
		out = serve(nil, late)
	case n > abi.MaxHostRequestBytes:
		out = serve(nil, fmt.Errorf("%w: request of %d bytes exceeds the %d-byte host-function request limit", abi.ErrResponse, n, abi.MaxHostRequestBytes))
	default:
		out = serve(guestSlice(mem, fn, ptr, n), nil)
	}
	fits := uint32(len(out)) <= capacity
	b.answer(fn, len(out), !fits)
	if c != nil {
		// The buffer serves the next answer, unless it is kept for
		// V2Response (kept as it is, not copied) or grew large (the host
		// does not hold a big answer's memory for the rest of the call).
		c.pending, c.scratch = nil, out
		if !fits {
			c.pending, c.scratch = out, nil
		} else if cap(out) > maxScratch {
			c.scratch = nil
		}
	}
	if fits {
		guestWrite(mem, fn, buf, out)
	}
	stack[0] = api.EncodeU32(uint32(len(out)))
}

// maxScratch is the largest answer buffer a v2 call keeps for reuse.
const maxScratch = 64 << 10

// errMainModule: the Extism SDK's layout is not the one mainModule knows.
var errMainModule = errors.New("cannot reach the guest's module through the Extism SDK (see mainModule)")

// mainModule returns an instance's main module: the guest itself, whose
// memory v2 reads and writes and whose protean_handle v2 calls directly.
// The Extism SDK (v1.7.1) hands host functions only the memory of its
// kernel (CurrentPlugin.Memory is the kernel's), and wraps the main module
// as Module{inner} without an accessor, so the wrapped api.Module is read
// by reflection, once per instance. TestMainModuleReachable pins the
// layout against the SDK in go.mod: an upgrade that changes it fails that
// test (and every v2 call, with errMainModule); it cannot silently reach
// the wrong module.
func mainModule(p *extism.Plugin) (api.Module, error) {
	v := reflect.ValueOf(p.Module()).Elem()
	f := v.FieldByName("inner")
	if !f.IsValid() || f.Kind() != reflect.Interface {
		return nil, errMainModule
	}
	m, ok := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(api.Module)
	if !ok || m == nil || m.Memory() == nil {
		return nil, errMainModule
	}
	return m, nil
}

// instanceV2 is what a v2 call needs of an instance, found once.
type instanceV2 struct {
	handle     api.Function
	initialize api.Function // _initialize of a WASI reactor, nil once run
	mem        api.Memory
}

func (m *Module) instanceV2(inst *extism.Plugin) (*instanceV2, error) {
	if v, ok := m.v2.Load(inst); ok {
		return v.(*instanceV2), nil
	}
	main, err := mainModule(inst)
	if err != nil {
		return nil, err
	}
	iv := &instanceV2{handle: main.ExportedFunction(abi.ExportHandle), initialize: main.ExportedFunction("_initialize"), mem: main.Memory()}
	if iv.handle == nil {
		return nil, fmt.Errorf("module does not export %s", abi.ExportHandle)
	}
	m.v2.Store(inst, iv)
	return iv, nil
}

// callV2 runs protean_handle of a v2 module directly through wazero: the
// Extism call protocol (input and output through its kernel, error_get)
// costs more than a projector's whole work. The guest runtime's
// _initialize runs first, once per instance, under the same deadline.
// Host functions defined through the Extism SDK find the instance in the
// context, as the SDK's own Call arranges.
func (m *Module) callV2(ctx context.Context, inst *extism.Plugin, c *callV2) (uint32, error) {
	iv, err := m.instanceV2(inst)
	if err != nil {
		return 0, err
	}
	c.mem = iv.mem
	ctx = context.WithValue(ctx, extism.PluginCtxKey("plugin"), inst)
	if iv.initialize != nil {
		if _, err := iv.initialize.Call(ctx); err != nil {
			return 0, fmt.Errorf("_initialize: %w", err)
		}
		iv.initialize = nil
	}
	res, err := iv.handle.Call(ctx)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("%s returns %d values; the ABI says one i32", abi.ExportHandle, len(res))
	}
	return api.DecodeU32(res[0]), nil
}

// emptyMemory is the memory of a host-function call outside a v2 handle:
// it has no bytes, so any pointer is out of bounds.
type emptyMemory struct{ api.Memory }

func (emptyMemory) Size() uint32                       { return 0 }
func (emptyMemory) Read(uint32, uint32) ([]byte, bool) { return nil, false }
func (emptyMemory) Write(uint32, []byte) bool          { return false }
