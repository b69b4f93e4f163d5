// Command trap is a test module that speaks the ABI by hand (go-pdk only,
// no kit) so its protean_handle can end in each way the host must tell
// apart by type: an out-of-bounds memory access (a wazero trap), a WASI
// proc_exit with a non-zero code, and a failure it reports itself whose
// text imitates a trap.
package main

import (
	"encoding/json"
	"os"
	"unsafe"

	extism "github.com/extism/go-pdk"
)

//go:wasmexport protean_manifest
func manifest() int32 {
	extism.OutputString(`{"abi_version": 1, "module": {"name": "trap", "version": "1.0.0"},
		"messages": [{"type": "Trap", "kind": "event", "category": "trap", "fields": [{"name": "op", "type": "string"}]}],
		"handlers": [{"name": "trap", "kind": "event_handler", "category": "trap", "handles": ["Trap"]}]}`)
	return 0
}

var sink byte

//go:wasmexport protean_handle
func handle() int32 {
	var req struct {
		Messages []struct {
			Data struct {
				Op string `json:"op"`
			} `json:"data"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(extism.Input(), &req); err != nil || len(req.Messages) == 0 {
		extism.SetErrorString("trap: bad request")
		return 1
	}
	switch req.Messages[0].Data.Op {
	case "oob":
		// Far past any memory the host grants: wazero traps with
		// "out of bounds memory access".
		sink = *(*byte)(unsafe.Pointer(uintptr(0xfffffff0)))
	case "exit":
		os.Exit(3)
	case "fail":
		// A guest's own failure that reads like a trap: the host must
		// not take the text for the type.
		extism.SetErrorString("wasm error: unreachable")
		return 1
	}
	extism.OutputString(`{"results": [{}]}`)
	return 0
}

func main() {}
