// Package abi is the contract between protean-host and a handler module:
// what a module exports, what it declares, what it receives and what it
// returns. This page is the reference an author reads to write a conforming
// module in any language; Go authors use package pdk, which implements it.
//
// # Calling convention
//
// Modules are WebAssembly modules using the Extism calling convention
// (https://extism.org): an export takes no parameters and returns an i32
// (0 for success); it reads its input with the Extism input functions
// (extism:host/env input_length, input_load_u8, input_load_u64) and writes
// its output with output_set; on failure it may set an error string with
// error_set and return non-zero. Any Extism PDK implements this. A WASI
// reactor (with _initialize) is supported; the host runs _initialize before
// the first export.
//
// Two ABI versions run side by side, chosen by each module's manifest
// (abi_version): v1, described on this page, where every document is
// UTF-8 JSON passed through Extism memory; and v2 (Version), the fast data
// path: the same contract with a binary envelope and results, one bulk
// copy in and out, and host functions (import module HostNamespaceV2) that
// read and write the module's own memory. v2.md in this directory is its
// byte-by-byte reference and rationale; package pdk speaks v2. Payloads
// are UTF-8 JSON in both.
//
// # Exports
//
// protean_manifest (ExportManifest) writes the module's Manifest. The host
// calls it once per load, under a deadline ([plugins.limits]
// manifest_timeout_ms) and a size limit (MaxManifestBytes). Example:
//
//	{
//	  "abi_version": 1,
//	  "module": {"name": "client_orders", "version": "1.0.0"},
//	  "messages": [
//	    {"type": "OrderPlaced", "kind": "event", "category": "order",
//	     "fields": [{"name": "order_id", "type": "string", "required": true},
//	                {"name": "client_id", "type": "string", "required": true},
//	                {"name": "total", "type": "float", "required": true}]}
//	  ],
//	  "handlers": [
//	    {"name": "client_orders", "kind": "projector", "category": "order",
//	     "handles": ["OrderPlaced"], "sequential_by": "client_id"}
//	  ]
//	}
//
// A module may also carry its manifest in a custom section named
// protean.manifest (ManifestSection): the section's content is the
// manifest's JSON, as protean_manifest writes it. The section is optional.
// When present, a host start may read it instead of calling
// protean_manifest, so it learns what the module declares without
// compiling or running it; so it must say what protean_manifest answers:
// the two, each decoded by DecodeManifest, must be deeply equal (the bytes
// may differ). A host that loads the module compiled (protean-host plugin
// test, validate, a reload) calls protean_manifest and refuses a module
// whose section differs. `protean-host plugin embed-manifest FILE` writes
// the section from the module's own answer (EmbedManifest); a module
// without the section, v1 or v2, loads as before.
//
// # Message fields
//
// Each declared message lists its top-level payload fields as {"name",
// "type", "required"}. The host checks every command's payload against
// its declaration before any guest runs (Message.CheckPayload), and
// answers a mismatch as the client's mistake (HTTP 422 naming the field):
//
//	string    a JSON string
//	int       a JSON number written as an integer (no fraction, no
//	          exponent) within int64: 42, -7; not 42.0, 1e3 or 2^63
//	float     a JSON number within float64: 42.5, 1e300; not 1e400
//	bool      true or false
//	object    a JSON object (its members are not checked)
//	array     a JSON array (its elements are not checked)
//	any, ""   any JSON value
//
// A field with "required": true must be present and not null; any other
// field may be absent or null. A key the message does not declare, or a
// key given twice, is refused. required was added within ABI version 1
// and is optional: absent means false. Package pdk derives fields from a
// Go struct: a field is required unless it is a pointer or an interface,
// is tagged omitempty or omitzero, or comes from an embedded pointer.
// Event payloads are not checked by the host: a module writes them.
//
// A handler that cannot decode a command payload (a value out of its Go
// type's narrower range, an int8 given 300) should fail it with kind
// rejected (package pdk does), so the client gets 422, not 500. An id
// over MaxIDLength that a command handler took verbatim from a command
// field (as a stream or record id, or in a load) is answered as a 422
// naming that field, not as the module's failure.
//
// Handler kinds are command_handler, event_handler, projector and
// process_manager. A process manager has no category; it names, per handled
// event, the field holding its correlation value:
//
//	{"name": "fulfillment", "kind": "process_manager",
//	 "handles": ["PaymentRecorded", "OrderShipped"],
//	 "correlate": {"PaymentRecorded": "order_id", "OrderShipped": "order_id"},
//	 "sequential_by": true}
//
// sequential_by is absent or null (not partitioned), a field name (event
// handler, projector, command handler), or true (process manager: each
// category is partitioned by that category's correlate field). A
// projector with a sequential_by field may add "documents_by_key": true
// (added within ABI version 1, optional): each of its documents is keyed
// by the field's value, so an event of key K writes only document K. The
// host fails a message whose result writes another document of the
// projector (permanently), and in return a read of document K as of a
// position waits for K's partition only, not for every key's. Every type
// a handler handles must be declared in messages, with its category and its
// top-level fields. Decoding is strict: unknown keys are errors. Names match
// [A-Za-z_][A-Za-z0-9_.]* (at most MaxNameLength); categories match
// [a-z][a-z0-9_]* because '-' separates a stream's category from its id and
// ':' separates a partition stream's parts.
//
// The host validates the whole set of modules at start and at every reload
// and refuses to run a set that breaks a rule: the ABI version matches; the
// partition field exists on every handled type; one key per stream
// category across all modules; the broker supports partitioning (or is the
// inline broker); every declaration of an event of a partitioned category
// carries the key field; module names, handler names and message
// declarations agree across modules; a command has one handler.
//
// protean_handle (ExportHandle) handles a batch of messages for one handler,
// in order. Input is a HandleRequest:
//
//	{"handler": "client_orders",
//	 "messages": [{"id": "0c9…", "type": "OrderPlaced", "stream": "order-o-1",
//	               "position": 0, "global_position": 17,
//	               "time": "2026-11-30T10:00:00Z",
//	               "data": {"order_id": "o-1", "client_id": "c-1", "total": 42.5},
//	               "metadata": {"correlation_id": "…"}}]}
//
// An event's metadata carries correlation_id, causation_id, tenant, and
// module: {"name", "version", "sha256"} of the module build whose handler
// emitted it (the host sets it; added within ABI version 1, optional).
// When the host traces, a message's metadata also carries traceparent and
// tracestate: the W3C trace context of the span that created it (added
// within ABI version 1, optional; the v2 binary encoding does not carry
// them to the guest).
//
// Output is a HandleResponse with one Result per message:
//
//	{"results": [
//	  {"effects": {
//	     "writes": [{"kind": "projection", "type": "client_orders", "id": "c-1",
//	                 "expected_version": 3, "data": {"orders": 4}}],
//	     "events": [{"stream": "order-o-1", "type": "OrderShipped",
//	                 "data": {…}, "expected_version": 5}],
//	     "commands": [{"type": "ShipOrder", "data": {…}}]}},
//	  {"error": {"kind": "transient", "message": "…"}}]}
//
// The host commits each result's effects in one unit of work (all of them
// or none), in order, up to the first error; it retries the failed message
// alone. A module may stop at its first error and return a shorter list
// that ends with that error. Error kinds: transient (a retry may help; the
// host retries with backoff), rejected (the domain said no; a command
// answers 422), permanent (a retry will not help; a command answers 500,
// an event halts its partition or is dead-lettered). A trap, a non-zero
// return, output over the max_output_bytes limit, or a call that outlives
// its deadline fails the whole batch; the host discards that instance.
//
// # Effects
//
// A module cannot touch the world except through the effects it returns:
//
//   - events: appended to Stream ("{category}-{id}"), with an optional
//     expected_version (the stream's current last position, -1 for a new
//     stream; absent: no check). The event's category must be the one its
//     type is declared on. If that category is partitioned, the event's data
//     must carry the key field with a valid key (see package partition), or
//     the whole unit of work fails and nothing is written.
//   - writes: replace a record (kind aggregate, projection or process; type
//     is the aggregate category, projector name or process manager name;
//     id its identity) if its version is expected_version (0 for a record
//     that does not exist yet); the record's version becomes
//     expected_version+1. data null deletes it. A stale version fails the
//     unit of work with a conflict.
//   - commands: dispatched after the unit of work commits.
//
// # Host functions
//
// Imported from module HostNamespace ("extism:host/user"), each taking and
// returning an Extism memory offset of a JSON document (i64 → i64), usable
// only during protean_handle:
//
//   - protean_load (HostLoad): LoadRequest {"kind","type","id"} →
//     LoadResponse {"found","version","data"} or {"error","error_kind"}. It returns
//     committed state. Within one batch, the module is expected to see its
//     own earlier writes: the host commits the batch's results only after
//     the call, so a module (package pdk does this) overlays the writes of
//     the batch's earlier successful messages on what the host returns.
//   - protean_read_stream (HostReadStream): ReadStreamRequest
//     {"stream","from","limit"} → ReadStreamResponse {"messages"} or
//     {"error","error_kind"}. One answer is a page: at most limit events
//     (the host caps it at 1,000) and at most the host's max_read_bytes
//     of event data and metadata (1 MiB by default; an event larger than
//     that comes alone). A short page is not the stream's end: read on
//     from the last position plus one until a page comes back empty.
//
// What the host does for one protean_handle call is bounded (the same in
// ABI v2): at most max_host_calls calls of load and read_stream, at most
// max_host_bytes in all their answers, and the answers the host holds
// count against the instance's memory. A call past one of these is ended
// by the host (the batch fails; no result is committed), so a module that
// reads a whole long stream in one call should expect to be stopped.
//
// error_kind (HostErrorKind) says whether a retry can help: scope (the
// request is outside what the module may touch: another module's record,
// a stream of a category it declares nothing on), invalid (malformed, over
// a limit, or outside protean_handle) and not_found never succeed on a
// retry; conflict and transient (the store failed, the call was canceled)
// may. A module should fail its message permanently on the first three
// and transiently on the others; package pdk does (HostErrorKind's
// HandlerKind). error_kind was added within ABI version 1 and is optional
// both ways: a module that does not read it keeps working, and a module
// must read a response without it (an older host) as transient.
//
// WASI clocks are the host's real wall and monotonic clocks; randomness
// is WASI's. Prefer the envelope's time for anything that must replay the
// same way.
//
// Logging uses Extism's own log functions (extism:host/env log_info, …);
// the host tags each line with the module. WASI is provided with no
// preopened directories, no environment, no sockets: a module has no files,
// network or environment unless its tenant is granted them in config.
//
// # Limits
//
// MaxManifestBytes bounds the manifest; [plugins.limits] bound memory
// (memory_mb), time per call (timeout_ms) and output (max_output_bytes,
// default DefaultMaxOutputBytes); MaxHostRequestBytes bounds a host-function
// request; MaxIDLength bounds record and stream ids.
package abi
