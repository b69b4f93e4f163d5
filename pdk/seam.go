package pdk

import "github.com/proteanhq/protean-host/pdk/internal/seam"

// The test host (package pdktest) runs handlers through the same handle
// the WASM export calls, with its in-memory host behind the seam.
func init() {
	seam.Handle = func(req []byte, h seam.Host) ([]byte, error) { return handle(req, jsonHost{seamHost{h}}) }
}

type seamHost struct{ h seam.Host }

func (s seamHost) load(req []byte) []byte       { return s.h.Load(req) }
func (s seamHost) readStream(req []byte) []byte { return s.h.ReadStream(req) }
func (s seamHost) log(level, msg string)        { s.h.Log(level, msg) }
