package abi

// Version is the newest ABI version this package describes. A module's
// manifest states the version it was built against; the host runs
// versions MinVersion to Version side by side (v1: JSON through Extism
// memory; v2: the binary fast path of v2.md) and refuses any other.
const Version = 2

// Exports a module provides. Both follow the Extism calling convention: no
// parameters, an i32 return (0 = success), input read with the Extism input
// functions and output written with output_set. A non-zero return (or a
// trap) with an error set through error_set is a module failure, not a
// handler error: handler errors travel inside the HandleResponse.
const (
	// ExportManifest takes no input and writes the module's Manifest as JSON.
	ExportManifest = "protean_manifest"
	// ExportHandle takes a HandleRequest as JSON and writes a HandleResponse
	// as JSON.
	ExportHandle = "protean_handle"
)

// HostNamespace is the import module under which the host provides its
// functions. It is the Extism user namespace, so any Extism PDK can declare
// them as ordinary host functions.
const HostNamespace = "extism:host/user"

// Host functions a module may import (signature (i64) -> i64: the parameter
// is an Extism memory offset holding a JSON request; the result is the offset
// of a JSON response the guest reads and may free). They are available only
// during a protean_handle call; outside one they answer with an error.
const (
	// HostLoad loads a record (aggregate, projection document or
	// process-manager state): LoadRequest in, LoadResponse out.
	HostLoad = "protean_load"
	// HostReadStream reads events of one stream: ReadStreamRequest in,
	// ReadStreamResponse out.
	HostReadStream = "protean_read_stream"
)

// Size limits. The host enforces them; a module that exceeds one fails with
// an error naming the limit.
const (
	// MaxManifestBytes bounds the manifest a module may return.
	MaxManifestBytes = 1 << 20
	// DefaultMaxOutputBytes is the default bound on a HandleResponse; the
	// host's [plugins.limits] max_output_bytes overrides it.
	DefaultMaxOutputBytes = 16 << 20
	// MaxNameLength bounds module, handler, message-type, category and field
	// names.
	MaxNameLength = 128
	// MaxHostRequestBytes bounds the JSON a guest may pass to a host
	// function.
	MaxHostRequestBytes = 1 << 20
)
