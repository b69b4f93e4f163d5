//go:build wasip1

package pdk

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"strconv"
	"unsafe"

	extism "github.com/extism/go-pdk"

	"github.com/proteanhq/protean-host/abi"
)

//go:wasmexport protean_manifest
func exportManifest() int32 {
	out, err := manifestJSON()
	if err != nil {
		extism.SetError(err)
		return 1
	}
	extism.Output(out)
	return 0
}

//go:wasmexport protean_handle
func exportHandle() int32 {
	if ABIVersion() == 1 {
		out, err := handle(extism.Input(), jsonHost{wasmHost{}})
		if err != nil {
			extism.SetError(err)
			return 1
		}
		extism.Output(out)
		return 0
	}
	// ABI v2: one bulk copy in, one out (abi/v2.md).
	tuneGC()
	in := make([]byte, v2InputLength())
	if len(in) > 0 {
		v2InputRead(unsafe.Pointer(&in[0]))
	}
	out, err := handleV2(in, v2Host{})
	if err != nil {
		msg := err.Error()
		v2Error(unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
		return 1
	}
	if v2Output(ptr(out), uint32(len(out))) != 0 {
		return 1
	}
	runtime.KeepAlive(out)
	return 0
}

// ABI v1 host functions.

//go:wasmimport extism:host/user protean_load
func hostLoad(uint64) uint64

//go:wasmimport extism:host/user protean_read_stream
func hostReadStream(uint64) uint64

type wasmHost struct{}

func call(fn func(uint64) uint64, req []byte) []byte {
	in := extism.AllocateBytes(req)
	defer in.Free()
	out := extism.FindMemory(fn(in.Offset()))
	defer out.Free()
	return out.ReadBytes()
}

func (wasmHost) load(req []byte) []byte       { return call(hostLoad, req) }
func (wasmHost) readStream(req []byte) []byte { return call(hostReadStream, req) }

func (wasmHost) log(level, msg string) {
	l := extism.LogInfo
	switch level {
	case "debug":
		l = extism.LogDebug
	case "warn":
		l = extism.LogWarn
	case "error":
		l = extism.LogError
	}
	extism.Log(l, msg)
}

// ABI v2 host functions (namespace abi.HostNamespaceV2).

//go:wasmimport protean:host/v2 input_length
func v2InputLength() uint32

//go:wasmimport protean:host/v2 input_read
func v2InputRead(p unsafe.Pointer)

//go:wasmimport protean:host/v2 output
func v2Output(p unsafe.Pointer, n uint32) uint32

//go:wasmimport protean:host/v2 error
func v2Error(p unsafe.Pointer, n uint32)

//go:wasmimport protean:host/v2 load
func v2Load(req unsafe.Pointer, reqLen uint32, buf unsafe.Pointer, bufCap uint32) uint32

//go:wasmimport protean:host/v2 read_stream
func v2ReadStream(req unsafe.Pointer, reqLen uint32, buf unsafe.Pointer, bufCap uint32) uint32

//go:wasmimport protean:host/v2 response
func v2Response(buf unsafe.Pointer, bufCap uint32) uint32

//go:wasmimport protean:host/v2 log
func v2Log(level uint32, p unsafe.Pointer, n uint32)

//go:wasmimport protean:host/v2 memory_limit
func v2MemoryLimit() int64

var gcTuned bool

// gcPercent, when set at link time (-ldflags "-X
// github.com/proteanhq/protean-host/pdk.gcPercent=N"), replaces the kit's
// GOGC of 200.
var gcPercent string

// tuneGC sizes the garbage collector, once. Go's default (GOGC=100, a
// 4 MiB minimum heap) collects often; the kit used GOGC=1000 to make
// collections rare, but then the heap only stops growing at the memory
// limit: a long-lived instance grew to 26 MB of linear memory (~26 MB
// RSS on the host) within 10,000 calls of client_orders. GOGC=200 (an
// 8 MiB minimum heap) keeps it at 13.5 MB, with warm calls within a few
// per cent of GOGC=1000 (BenchmarkGuestSize in internal/host: client_orders
// 0.98x, orders 1.04x, in one run); GOGC=100 keeps it at 9.4 MB for
// 1.02x-1.09x. The memory limit, three quarters of the sandbox's cap,
// makes the collector run before memory.grow would fail.
func tuneGC() {
	if gcTuned {
		return
	}
	gcTuned = true
	pct := 200
	if n, err := strconv.Atoi(gcPercent); err == nil && n != 0 {
		pct = n
	}
	debug.SetGCPercent(pct)
	if n := v2MemoryLimit(); n > 0 {
		debug.SetMemoryLimit(n / 4 * 3)
	}
}

func ptr(b []byte) unsafe.Pointer {
	if cap(b) == 0 {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

// v2Host calls the v2 host functions, with one request buffer and one
// answer buffer reused across calls.
type v2Host struct{}

var v2Req, v2Resp = make([]byte, 0, 256), make([]byte, 4096)

func v2Call(fn func(unsafe.Pointer, uint32, unsafe.Pointer, uint32) uint32, req []byte) []byte {
	n := fn(ptr(req), uint32(len(req)), ptr(v2Resp), uint32(len(v2Resp)))
	if int(n) > len(v2Resp) {
		v2Resp = make([]byte, n)
		v2Response(ptr(v2Resp), n)
	}
	runtime.KeepAlive(req)
	return v2Resp[:n]
}

func (v2Host) load(req *abi.LoadRequest) (*abi.LoadResponse, error) {
	v2Req = abi.AppendLoadRequestV2(v2Req[:0], req)
	resp, err := abi.DecodeLoadResponseV2(v2Call(v2Load, v2Req))
	if err != nil {
		return nil, err
	}
	resp.Data = bytes.Clone(resp.Data) // the answer buffer is reused
	return resp, nil
}

func (v2Host) readStream(req *abi.ReadStreamRequest) (*abi.ReadStreamResponse, error) {
	v2Req = abi.AppendReadStreamRequestV2(v2Req[:0], req)
	// The envelopes alias the answer's bytes, and the handler keeps them.
	return abi.DecodeReadStreamResponseV2(bytes.Clone(v2Call(v2ReadStream, v2Req)))
}

func (v2Host) log(level, msg string) {
	l := uint32(1)
	switch level {
	case "debug":
		l = 0
	case "warn":
		l = 2
	case "error":
		l = 3
	}
	v2Log(l, unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
}
