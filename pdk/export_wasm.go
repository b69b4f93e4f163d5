//go:build wasip1

package pdk

import (
	extism "github.com/extism/go-pdk"
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
	out, err := handle(extism.Input(), wasmHost{})
	if err != nil {
		extism.SetError(err)
		return 1
	}
	extism.Output(out)
	return 0
}

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
