// Package engine runs handler modules against the stores.
//
// Dispatch sends a command to the module that handles its type, checks the
// effects it returns against the module's scope, and commits them in one
// unit of work; commands the effects ask for are dispatched after the
// commit. Handler is the delivery side: every delivery source (the broker
// consumer groups, package internal/groups; the Redis partition workers; the
// event-store subscriptions) settles its runs by the one algorithm of
// delivery.Core.Deliver and hands each run to Handler, the one guest call
// and group commit of handleRun (handlerun.go): the messages before a
// failure commit, each with its unit's fenced position when the batch has
// a unit, and a call that failed as a whole is marked (delivery.MarkWhole)
// so the core splits it into one call per message. Classify tells the core
// which errors are the message's own. With Options.Partitioned,
// partitioned categories are the partition workers'; with
// Options.EventStore, every category is the event-store subscriptions', so
// each handler has one delivery path (package internal/routes lists each
// source's groups).
//
// WaitHandled serves read-your-writes (GET /v1/projections/…?min_position=N):
// it waits until a projector or process manager has handled every event of
// its categories at or below a global position. The wait is package
// readyourwrites'; the engine marks what its handlers commit and names,
// per category, the source that delivers it (progress.go):
// Options.BrokerProgress for the broker groups (groups.Progress), or
// Options.Progress (partition.Progress, subscription.Progress), each
// answering from its own storage.
//
// A module's scope is what it may read and write, from its manifest AND
// its tenant's ownership (host.Ownership, decided by config at
// validation): it writes aggregates, appends events and reads streams of
// the categories it declares that its tenant owns; it reads (loads
// aggregates, reads streams) categories it declares whose owner grants its
// tenant read (grant_read), never writes them; it reads and writes the
// projection documents and process state of its own projectors and
// process managers; and it dispatches follow-up commands of its own
// tenant, or those another tenant grants it (grant_dispatch). The checks
// live in one place (scope.go), which every host function, of whatever
// ABI version, and every effect goes through. Anything else fails the
// message, permanently, with a *ScopeError naming the module and its
// tenant.
//
// Follow-up work is bounded per causation chain (cascade.go): the host
// sets abi.Metadata.CascadeDepth on every event a handler appends and every
// follow-up command it asks for (one more than the message's own), so the
// depth survives the event store and the broker; a message at
// Options.MaxCascadeDepth asking for events or commands, or one asking for
// more than Options.MaxFollowUps, fails permanently (ErrFollowUpDepth,
// ErrFollowUps). A cascade that feeds itself through events and commands
// therefore ends, whatever route it loops through.
//
// Lifecycle. New takes the set; the sources that hand it runs are stopped
// first, by their own Stop; Stop then ends the engine in two phases. Soft:
// new commands are refused (ErrStopped), and commands in flight and runs
// in hand run to their end and commit; then every module set the engine
// owns (the running one and any a reload retired and still in use) is
// closed, and Stop returns nil. Hard, if Stop's ctx ends first: every
// guest call and commit runs under the engine's own context as well as
// its caller's (a command's HTTP request, a source's run), and Stop
// cancels that context, so the work returns at once, commits nothing, and
// Stop returns ctx's error within StopGrace. A call into an
// uninterruptible module cannot be canceled while it runs guest code: Stop
// returns ErrAbandoned at its deadline plus StopGrace and leaves the call
// to finish in the background; its result is discarded and its set closed
// after it, and Done reports when that has happened. Every goroutine the
// engine starts (the closing of retired sets, Stop's finisher) is waited
// for by Stop or, for abandoned work, by Done. A second Stop is a no-op.
package engine
