// Package seam lets package pdktest run a module's handlers natively. The
// handlers and the module's registry live in package pdk, which talks to
// the host through an interface; pdk fills Handle from its init, so a test
// host can call the same code the protean_handle export runs, without
// widening pdk's public surface for it.
package seam

// Host is what a handle needs from the host: the two host functions (JSON
// in, JSON out, as over the ABI) and logging.
type Host interface {
	Load(req []byte) []byte
	ReadStream(req []byte) []byte
	Log(level, msg string)
}

// Handle runs a HandleRequest (JSON) against h and returns the
// HandleResponse (JSON), as protean_handle does. Set by package pdk.
var Handle func(req []byte, h Host) ([]byte, error)
