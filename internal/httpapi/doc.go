// Package httpapi is the HTTP API of a running host:
//
//	POST /v1/commands/{type}          dispatch a command; body = its fields as a JSON object;
//	                                  optional Idempotency-Key header (idempotentCommand)
//	GET  /v1/projections/{name}/{id}  a projection document (X-Record-Version carries its version);
//	                                  ?min_position=N waits, at most Options.ReadWait, until the
//	                                  projection's handler has handled global position N (504 past
//	                                  it; the engine's HandledWaiter ability; 500 at once, naming
//	                                  it, when an event at or below N failed and is recorded for
//	                                  an operator: readyourwrites.ErrFailed); a document the engine
//	                                  holds in memory as of N or later (its DocumentCache ability)
//	                                  is answered without the wait or a read
//	GET  /v1/plugins                  the modules (running, or rejected by the last reload) with state and
//	                                  last error, their handlers' categories and partition keys, the last reload
//	GET  /                            the status page: server-rendered HTML (status.html, embedded), no script,
//	                                  refreshing itself; it reads Options.Status, which cmd/protean-host implements
//	GET    /v1/modules                the modules of the tenants the credential deploys (modules.go;
//	                                  served when Options.Modules is set, else 404)
//	PUT    /v1/modules/{name}         deploy a module's bytes, validated as a reload (422 with the
//	                                  reload's problems when rejected; the previous bytes are back)
//	DELETE /v1/modules/{name}         remove a module, validated the same way
//	POST   /v1/modules/{name}/rollback  put back the module's newest earlier version
//	GET  /healthz                     200 while the host accepts work, 503 while it stops
//	GET  /metrics                     Prometheus text format
//
// Errors are JSON {"error": "..."}: 400 malformed body, 404 unknown command
// type, projection or document, 405 a known path with another method, 408
// a body not read within Options.BodyTimeout, 409 expected-version
// conflict, 413 body over MaxBodyBytes, 422 validation (a rejected
// partition key, or a handler's rejection), 500 handler failure, 503
// stopping. A command body that does not match its declared fields
// (abi.Message.CheckPayload) answers 422 with {"error", "fields"}, fields
// naming the offending fields. Error messages are cut at MaxErrorBytes, so
// an answer stays short whatever the client sent.
//
// Text is refused, never changed (input.go): X-Correlation-ID and
// Idempotency-Key over MaxHeaderValueBytes or not printable ASCII answer
// 400 naming the header; a path that is not UTF-8 or holds a NUL, 400; a
// body that is not UTF-8, 400 naming the byte offset; a string holding
// \u0000 or a lone surrogate escape, or a number literal over
// MaxNumberDigits digits, 422 naming the field by its path
// (order.lines[1].sku). A Content-Length over MaxBodyBytes answers 413
// before any 100 Continue; a chunked body over it is read and dropped up
// to a bound, then answered 413, so the client reads the answer instead of
// a reset.
package httpapi
