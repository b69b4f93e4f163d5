// Package host loads handler modules and runs them in a sandbox.
//
// Files (file.go): only a regular file named *.wasm is read from the
// plugins directory. Each is opened non-blocking beneath the directory
// (os.Root), fstatted, and sized against its max_module_bytes before a
// byte is read, then read through a bound of that plus one: a named pipe
// once blocked every reload for ever, a link to /dev/urandom ran a host
// out of memory, and a link out of the directory read /etc/shadow. A
// named pipe, device, socket or directory is refused by name
// (ErrNotRegular), so is a link out of the directory (ErrLinkOut), and a
// link within it unless LoaderOptions.RefuseLinks ([plugins] follow_links
// = false; ErrSymlink). A directory or file others may write is logged,
// or refused under RefuseWritable (ErrWritable).
//
// A Loader compiles each *.wasm file of the plugins directory through the
// Extism SDK on wazero (with a compilation cache, on disk when
// [plugins] cache_dir is set), instantiates it once to call
// protean_manifest under a deadline and a size limit, and decodes the
// manifest strictly (package abi). Every failure is a *LoadError naming the
// file: an empty file, bytes that are not WebAssembly, a truncated module,
// a module without the export, a manifest that is malformed, too large,
// traps or never returns. Before compiling, the module's shape (nesting
// depth, locals, body sizes, function count) is checked against the
// Limits during the instrumentation's walk: wazero cannot interrupt a
// compilation, so a compile bomb is refused (ErrShapeLimit) before one
// starts; compile_timeout_ms is the backstop for what passes.
//
// Validate checks a whole module set, as at start and on every reload, and
// returns every Problem it finds, each naming the module file and, where
// they apply, the handler, message type and field:
//
//   - abi_version: the module was built for this host's ABI;
//   - field_existence: every type a partitioned handler handles declares
//     its sequential_by field (for a process manager with sequential_by =
//     true, the correlate field of each event);
//   - one_key: a stream category is partitioned by one key across all
//     modules (a process manager's correlate fields count);
//   - broker: the outbox broker advertises STREAM_PARTITIONING (redis) or
//     is the inline broker, where sequential_by is an accepted no-op;
//   - event_key: every module that declares an event of a partitioned
//     category declares the key field too;
//   - consistency: module and handler names are unique, a message type has
//     one kind and one category, a command has one handler;
//   - tenant (ValidateTenants, tenant.go): a category, and so its event and
//     command types, belongs to one tenant: the one whose modules write it
//     (declare a command on it, handle commands on it, or declare an event
//     on it that none of their own subscribers handle), never decided by
//     file order. Two tenants claiming one category: at a reload
//     (ValidateTenantsOver) the tenant that owns it in the running set
//     keeps it and each other claimant's file is refused, naming the
//     owner; with no running owner among them, each claimant's file is
//     refused (config names no category's owner). Another tenant's
//     module may subscribe to (declare as handled) an event of it only
//     where the owner grants it read (grant_read), and may declare one of
//     its commands (to dispatch it) only where the owner grants it
//     (grant_dispatch). Modules no tenant lists belong to DefaultTenant
//     ("default").
//
// LoadDir loads a directory's files on GOMAXPROCS goroutines. With a cache
// directory, every load writes the module's manifest memo beside its
// compiled code (memo.go): what protean_manifest answered, how the
// deadline is enforced, and the code's cache key, under the file's SHA-256
// and the limits that decide a load. A directory load that finds the memo
// compiles nothing, and a start that finds none reads the manifest on
// wazero's interpreter, a fraction of a compile (or in the module's
// protean.manifest section, if it has one): either way the module is
// loaded with its code not compiled, as after a code release, and compiled
// in the background once the directory is loaded (warm.go; the module is
// Warming meanwhile) or, with Limits.CodeIdle, at its first call. A
// reload compiles a new version that has no memo before it goes live;
// LoadFile always compiles. Modules with the same bytes under the same
// deadline mode and memory limit share one compile (sharedcode.go).
//
// A Reloader reloads the plugins directory (on a signal, or watching it)
// and composes the set per module (candidate.go): per file the version on
// disk if it loads, else the running one; a changed file the set's
// problems name keeps its running version (or stays out, if new), then
// the changed files are tried one at a time; a re-partition, or a set
// that cannot be composed at all, rejects the reload as a whole. One bad
// file does not hide a good edit of another module: the reload is
// Partial, and ReloadStatus.Rejected reports each file held back, with
// its digest and since when, until a version of it loads.
//
// A Set is a validated module set with the lookups the engine needs.
// Module.Handle runs a batch through a pooled instance (at most
// GOMAXPROCS per module by default; instances are not goroutine-safe) under
// the module's deadline, with the guest's host-function calls answered by
// the Session carried in the call's context. A trap, a non-zero return, a
// deadline or an unusable output is a *CallError; the instance is then
// discarded, because a trapped instance is dead even if it looks open.
// Instances are made on a module's first calls and reused most recent
// first; one idle for Limits.InstanceIdle is closed by the Loader's
// reaper (idle.go), so a module that runs rarely holds its compiled code
// but no instance. With Limits.CodeIdle and a cache directory, the reaper
// also releases the compiled code of a module with no instance and no
// call for that long, and its next call compiles it again from the disk
// cache, one compile for all the calls that wait on it (codeidle.go).
//
// Before it takes an instance, a call takes a slot of its tenant's share
// of the host's guest concurrency (fairshare.go, the loader's Scheduler):
// slots host-wide, a cap per tenant, freed slots to the queued tenant with
// the least weighted usage, so no tenant takes every core. What each
// tenant uses (tenantstats.go, Tenants) sums its modules' Usage: the wall
// time their calls ran (not CPU time, which Go cannot read per
// goroutine), their live instances' memory meters, and an estimate of
// their compiled code (wazero tells no size).
//
// What the host does on a guest's behalf is counted against the guest
// (budget.go): each call may make at most Limits.MaxHostCalls load and
// read_stream calls, their answers may hold Limits.MaxHostBytes in all, a
// read_stream page holds at most Limits.MaxReadBytes of events (the
// Session reads the store within it), and an answer the host holds is
// charged to the instance's memory meter. A call past one of these ends
// with a *HostLimitError naming the function and the limit. A host
// function called after the call's deadline answers an error unread.
//
// The deadline (deadline.go, docs/deadline.md) is enforced by instrumenting
// the module at load (package instrument): a fuel counter checked at every
// loop header and at the entry of functions on a call-graph cycle, calling
// into the host (the instance's sched_yield) every instrument.Period
// checks, where the host refills it or, past the deadline or on
// cancellation, leaves it at 0 so the guest traps; the host also zeroes it
// from context.AfterFunc. It costs 1.1-1.2x of no deadline, where wazero's
// close-on-context-done (the fallback for a module the rewriter refuses,
// Module.Deadline "runtime") costs 3-4.5x on the example projector and
// ~30x per loop iteration. A start section runs after instantiation under
// the deadline. docs/deadline.md has the bound and the RATIONALE. The
// same call into the host is where a call that has run a millisecond
// (timeSlice) lets other goroutines run: Go would preempt it only after
// 10 ms, which another tenant's command waited for at each of its steps.
// There too a long call takes turns at the cores with the others, and
// while two tenants are active one core is kept from long work, so the
// network is read and short calls run at once (cores.go).
//
// A module's manifest picks its ABI: v1 calls go through the Extism SDK's
// call protocol with JSON; v2 calls (abiv2.go, abi/v2.md) call the
// module's protean_handle through wazero directly, hand it the batch in
// one bounds-checked copy into its memory and take its output in one copy
// after checking the output limit, and serve the v2 host functions
// (HostFunctionsV2, registered by every Loader) on the module's memory. A
// pointer outside that memory ends the call with a *GuestMemoryError.
package host
