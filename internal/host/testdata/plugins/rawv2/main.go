// Command rawv2 is a test module that speaks ABI v2 by hand (no kit), so
// it can hand the v2 host functions wild pointers and lengths: its
// protean_handle does what -ldflags "-X main.variant=NAME" says. Each
// variant must end the call with a clear error and leave the host
// serving.
package main

import (
	"unsafe"

	extism "github.com/extism/go-pdk"
)

var variant = "ok"

//go:wasmexport protean_manifest
func manifest() int32 {
	extism.OutputString(`{"abi_version": 2, "module": {"name": "rawv2", "version": "1.0.0"},
		"messages": [{"type": "Ping", "kind": "event", "category": "ping", "fields": [{"name": "id"}]}],
		"handlers": [{"name": "pinger", "kind": "event_handler", "category": "ping", "handles": ["Ping"]}]}`)
	return 0
}

//go:wasmimport protean:host/v2 input_length
func inputLength() uint32

//go:wasmimport protean:host/v2 input_read
func inputRead(p uint32)

//go:wasmimport protean:host/v2 output
func output(p, n uint32) uint32

//go:wasmimport protean:host/v2 error
func setError(p, n uint32)

//go:wasmimport protean:host/v2 load
func load(req, reqLen, buf, bufCap uint32) uint32

//go:wasmimport protean:host/v2 read_stream
func readStream(req, reqLen, buf, bufCap uint32) uint32

//go:wasmimport protean:host/v2 response
func response(buf, bufCap uint32) uint32

//go:wasmimport protean:host/v2 log
func log(level, p, n uint32)

const wild = 0xFFFF_FFF0

func addr(b []byte) uint32 { return uint32(uintptr(unsafe.Pointer(&b[0]))) }

var in = make([]byte, 1<<16)

// oneEmptyResult is a v2 HandleResponse with one result without effects.
var oneEmptyResult = []byte{1, 0, 0, 0, 0}

// loadReq is a v2 load request for projection pinger/p-1.
var loadReq = []byte{2, 6, 0, 0, 0, 'p', 'i', 'n', 'g', 'e', 'r', 3, 0, 0, 0, 'p', '-', '1'}

//go:wasmexport protean_handle
func handle() int32 {
	buf := make([]byte, 64)
	switch variant {
	case "ok":
		inputRead(addr(in))
	case "wild_input":
		inputRead(wild)
	case "wild_output":
		return int32(output(wild, 64))
	case "huge_output":
		// A length far over the limit at a valid pointer: refused before
		// any copy.
		return int32(output(addr(buf), 0x7FFF_FFFF))
	case "wild_load_request":
		load(wild, 64, addr(buf), uint32(len(buf)))
	case "wild_load_buffer":
		load(addr(loadReq), uint32(len(loadReq)), wild, 64)
	case "huge_load_request":
		// Over the request limit: answered as invalid, without reading.
		buf = make([]byte, 1024)
		n := load(addr(buf), 0x7FFF_FFFF, addr(buf), uint32(len(buf)))
		if n == 0 || n > 1024 || buf[0] != 2 { // status 2: invalid
			msg := []byte("expected an invalid answer")
			setError(addr(msg), uint32(len(msg)))
			return 1
		}
	case "wild_read_stream":
		readStream(wild, 8, addr(buf), uint32(len(buf)))
	case "wild_response":
		load(addr(loadReq), uint32(len(loadReq)), addr(buf), 1) // too small: kept
		response(wild, 1<<20)
	case "wild_log":
		log(1, wild, 100)
	case "wild_error":
		setError(wild, 100)
		return 1
	}
	return int32(output(addr(oneEmptyResult), uint32(len(oneEmptyResult))))
}

func main() {}
