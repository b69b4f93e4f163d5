// Command raw is a test module that speaks the ABI by hand (go-pdk only, no
// kit), so it can misbehave: its protean_manifest export does what
// -ldflags "-X main.variant=NAME" says.
package main

import (
	"strings"

	extism "github.com/extism/go-pdk"
)

var variant = "malformed"

var sink int

//go:wasmexport protean_manifest
func manifest() int32 {
	switch variant {
	case "malformed":
		extism.OutputString(`{"abi_version": 1, "module": {"name": "raw"`)
	case "huge":
		extism.OutputString(`{"abi_version": 1, "pad": "` + strings.Repeat("x", 2<<20) + `"}`)
	case "loop":
		for i := 0; ; i++ {
			sink += i
		}
	case "trap":
		panic("manifest trapped on purpose")
	case "fail":
		extism.SetErrorString("refusing on purpose")
		return 1
	case "abi3":
		extism.OutputString(`{"abi_version": 3, "module": {"name": "future", "version": "2.0.0"},
			"messages": [{"type": "Ping", "kind": "event", "category": "ping", "fields": [{"name": "id"}]}],
			"handlers": [{"name": "pinger", "kind": "event_handler", "category": "ping", "handles": ["Ping"]}]}`)
	}
	return 0
}

func main() {}
