// Command exiter is a hostile ABI v1 test module written on the Extism
// kit alone: its handler sets a valid output and then calls WASI
// proc_exit(0), which Extism does not report as an error. The call
// succeeds; the instance is dead and must not serve another call.
package main

import (
	"os"

	extism "github.com/extism/go-pdk"
)

const manifest = `{"abi_version":1,"module":{"name":"exiter","version":"1.0.0"},
"messages":[{"type":"Exit","kind":"event","category":"exit","fields":[]}],
"handlers":[{"name":"exiter","kind":"event_handler","category":"exit","handles":["Exit"]}]}`

//go:wasmexport protean_manifest
func exportManifest() int32 {
	extism.OutputString(manifest)
	return 0
}

//go:wasmexport protean_handle
func exportHandle() int32 {
	extism.OutputString(`{"results":[{}]}`)
	os.Exit(0)
	return 0
}

func main() {}
