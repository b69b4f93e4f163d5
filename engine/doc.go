// Package engine runs handler modules against the stores.
//
// Dispatch sends a command to the module that handles its type, checks the
// effects it returns against the module's scope, and commits them in one
// unit of work; commands the effects ask for are dispatched after the
// commit. Start runs the delivery side: one consumer per (handler,
// category) pair reading the broker stream of that category as the
// handler's consumer group, one message at a time and in order, acking on
// commit and nacking on failure (the broker retries with backoff and
// dead-letters after its retries).
//
// A module's scope is what it may read and write: aggregates of the
// categories its messages are declared on, the projection documents and
// process state of its own projectors and process managers, streams of its
// categories, and events of the types it declares (on their declared
// category). Anything else fails the message with a *ScopeError.
//
// Stop is a soft stop with a hard deadline: new commands are refused
// (ErrStopped), commands in flight and the messages consumers hold finish;
// if ctx ends first, work in progress is canceled.
package engine
