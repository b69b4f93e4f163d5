// Package instrument rewrites a WebAssembly module at load so that the host
// can stop it at a deadline for almost nothing.
//
// Module appends one mutable i32 global, the fuel, exported as FuelGlobal,
// and inserts at every loop header, and at the entry of every function on
// a cycle of the call graph (which bounds loop-free recursion, see
// recursive), a check (see
// checkCode): count the fuel down; at 0 call WASI's sched_yield, which
// the host answers (wazero's osyield hook) by refilling the fuel to
// Period, or by leaving it at 0 once the call's deadline has passed or its
// context is cancelled; at 0 after the call, trap (unreachable). The host
// also sets the fuel to 0 from another goroutine when the deadline fires,
// so a stop is normally immediate; the call every Period checks is what
// bounds it when no other goroutine can run (guest code cannot be
// preempted, so with every P running a guest, no timer fires), and it is
// where the Go scheduler can preempt the guest's goroutine.
//
// Why the rewrite is this small:
//
//   - a defined global appended after the existing ones shifts no index,
//     so no global.get/global.set elsewhere changes;
//   - an if-block without branches out of it changes no label depth, so
//     no br, br_if or br_table changes;
//   - the call goes to sched_yield, which every Go (wasip1) module
//     imports already: no import is added, so no function index shifts.
//     A module without it (C, AssemblyScript) gets the import appended
//     after its imports, and every defined function's index grows by
//     one: call, ref.func, exports, the start function, element segments,
//     global initialisers and the name section are renumbered.
//
// A start section runs inside instantiation, where no call deadline can be
// armed; Module removes it and exports its function as StartExport, and
// the host calls that right after instantiation under the deadline.
//
// Module copies every section it does not change byte for byte (custom
// sections, data count, names), and decodes every instruction of every
// function body: MVP, sign extension, saturating conversions, bulk memory,
// reference types, multi-value block types and SIMD, which is what Go
// (wasip1), TinyGo, clang/wasi-libc and AssemblyScript emit and what
// wazero runs. Anything else (threads, exceptions, tail calls, GC, relaxed
// SIMD) is refused with an *OpcodeError naming the function, the offset
// and the opcode. A custom section named CustomSection records Version,
// so the bytes (and with them wazero's compilation-cache key, a hash of
// the bytes) change when the instrumentation does.
//
// The same walk checks the module's shape against Limits (nesting depth
// and its squares summed, locals, body size, function count) and refuses
// a module over one with a *LimitError before anything compiles it:
// wazero's compile time grows with the square of a function's nesting and
// cannot be interrupted. Check runs the walk alone, for a module that is
// not instrumented.
//
// The split of a module into its sections is package wasmbin's, shared
// with package abi (which reads and writes the protean.manifest section);
// sections adds the counts checks wazero needs (checkCount).
//
// BoundTables, on the same section reader, gives every table the module
// defines a maximum of at most the host's max_table_elements (wazero
// enforces a declared maximum and nothing else), whatever the deadline
// mode.
//
// No maintained Go codec fits: github.com/tetratelabs/wabin (the one on
// the module proxy, unmaintained since 2023) decodes sections but not
// instructions, and its encoder drops the data count section; this
// package needs an instruction walker anyway and splices sections
// byte for byte.
package instrument
