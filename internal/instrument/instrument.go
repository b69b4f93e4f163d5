package instrument

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/internal/wasmbin"
)

// Version is the instrumentation's version, recorded in CustomSection.
// Bump it whenever Module's output changes for the same input.
const Version = 3

// Period is how many checks the guest passes between two calls into the
// host (Result's fuel runs from Period down to 0). The host refills it to
// Period, or leaves it at 0 to stop the guest.
const Period = 1 << 14

// Names the rewritten module exports or carries.
const (
	// FuelGlobal is the exported mutable i32 global each check counts
	// down; at 0 the guest calls YieldImport, and traps if the host left
	// it at 0.
	FuelGlobal = "__protean_fuel"
	// StartExport is the start section's function, exported for the host
	// to call after instantiation (present only if there was one).
	StartExport = "__protean_start"
	// CustomSection is the custom section that records Version.
	CustomSection = "protean.instrument"
	// YieldModule and YieldImport name the imported function the checks
	// call every Period checks: WASI's sched_yield, which every Go
	// (wasip1) module imports already, so no import is added and no
	// function index shifts. wazero answers it with the instance's
	// ModuleConfig.WithOsyield hook, where the host checks the deadline
	// and refills the fuel.
	YieldModule = "wasi_snapshot_preview1"
	YieldImport = "sched_yield"
)

// Errors Module returns.
var (
	// ErrMalformed is a module Module cannot parse (wazero would refuse it
	// too).
	ErrMalformed = wasmbin.ErrMalformed
	// ErrUnsupported is a module using what Module does not instrument;
	// an *OpcodeError carries the detail.
	ErrUnsupported = errors.New("unsupported by the instrumentation")
	// ErrReserved is a module that already exports FuelGlobal or
	// StartExport, or carries CustomSection.
	ErrReserved = errors.New("module uses a name reserved for the instrumentation")
)

// OpcodeError is an instruction Module does not instrument.
type OpcodeError struct {
	// Func is the function's index in the module's function index space
	// (imports first).
	Func uint32
	// Offset is the instruction's offset within the module's bytes.
	Offset int
	// Opcode names the instruction: its byte, with the prefix's
	// sub-opcode for 0xFC/0xFD/0xFE, and its name where known.
	Opcode string
}

func (e *OpcodeError) Error() string {
	return fmt.Sprintf("%v: function %d: opcode %s at offset %#x", ErrUnsupported, e.Func, e.Opcode, e.Offset)
}

// Unwrap returns ErrUnsupported.
func (e *OpcodeError) Unwrap() error { return ErrUnsupported }

// Result is a rewritten module.
type Result struct {
	// Bytes is the instrumented module.
	Bytes []byte
	// HasStart reports whether the module had a start section (now
	// exported as StartExport).
	HasStart bool
	// Checks is the number of checks inserted.
	Checks int
}

// Section ids.
const (
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secTable     = 4
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElement   = 9
	secCode      = 10
	secDataCount = 12
	secTag       = 13
)

// rank orders known sections as the binary format requires; custom
// sections (0) may appear anywhere.
func rank(id byte) int {
	switch id {
	case secTag:
		return 55 // between memory (5) and global (6)
	case secDataCount:
		return 95 // between element (9) and code (10)
	}
	return int(id) * 10
}

// section is one section of a module.
type section = wasmbin.Section

// sections splits the module b into its sections (package wasmbin's walk)
// and checks the counts and sizes wazero trusts (see checkCount).
func sections(b []byte) ([]section, error) {
	secs, err := wasmbin.Sections(b)
	if errors.Is(err, wasmbin.ErrVersion) {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if err != nil {
		return nil, err
	}
	for _, s := range secs {
		if err := checkCount(s.ID, s.Payload, len(b)); err != nil {
			return nil, err
		}
		if s.ID == secDataCount {
			// Exactly one u32. wazero reads a short one past the section's
			// end, into whatever follows it (fuzzing found an empty one it
			// took, which stops compiling once a section follows it).
			pr := reader{b: s.Payload}
			if _, err := pr.u32(); err != nil || pr.off != len(s.Payload) {
				return nil, fmt.Errorf("%w: data count section of %d bytes is not one u32", ErrMalformed, len(s.Payload))
			}
		}
	}
	return secs, nil
}

// checkCount refuses a section whose leading vector count cannot fit: every
// entry of a known vector section takes at least one byte of its payload,
// and a data count at least one byte of the module. wazero sizes its
// tables by these counts before it reads the entries, so a module of a few
// bytes that claims four billion functions would make it allocate 16 GiB:
// fuzzing found this killing the process. Such a module is refused here,
// before wazero sees it.
func checkCount(id byte, p []byte, module int) error {
	switch id {
	case secCustom, secStart:
		return nil
	}
	r := reader{b: p}
	n, err := r.u32()
	if err != nil {
		return fmt.Errorf("%w: section %d: no count", ErrMalformed, id)
	}
	limit := len(p) - r.off
	if id == secDataCount {
		limit = module
	}
	if uint64(n) > uint64(limit) {
		return fmt.Errorf("%w: section %d claims %d entries in %d bytes", ErrMalformed, id, n, limit)
	}
	return nil
}

// Module instruments the binary module b. b is not modified. Its walk of
// every function body also checks lim (see Limits): a module over one is
// refused with a *LimitError.
func Module(b []byte, lim Limits) (*Result, error) {
	secs, err := sections(b)
	if err != nil {
		return nil, err
	}

	var importedFuncs, importedGlobals, definedGlobals uint32
	var types [][]byte
	yield, yieldType, hasYield := uint32(0), uint32(0), false
	start, hasStart := uint32(0), false
	for _, s := range secs {
		switch s.ID {
		case secCustom:
			r := reader{b: s.Payload}
			name, err := r.name()
			if err != nil {
				return nil, err
			}
			if name == CustomSection {
				return nil, fmt.Errorf("%w: custom section %s", ErrReserved, CustomSection)
			}
		case secType:
			var err error
			if types, err = splitTypes(s.Payload); err != nil {
				return nil, err
			}
		case secImport:
			im, err := countImports(s.Payload)
			if err != nil {
				return nil, err
			}
			importedFuncs, importedGlobals = im.funcs, im.globals
			yield, yieldType, hasYield = im.yield, im.yieldType, im.hasYield
		case secGlobal:
			r := reader{b: s.Payload}
			n, err := r.u32()
			if err != nil {
				return nil, err
			}
			definedGlobals = n
		case secExport:
			if err := checkExports(s.Payload); err != nil {
				return nil, err
			}
		case secStart:
			r := reader{b: s.Payload}
			f, err := r.u32()
			if err != nil {
				return nil, err
			}
			start, hasStart = f, true
		}
	}
	// Without a sched_yield import, add one at the end of the imports:
	// every defined function's index then grows by one (renumbering).
	var adds [4]addition // type, import, global, export
	rn := renumber{from: ^uint32(0)}
	if hasYield && (int(yieldType) >= len(types) || !bytes.Equal(types[yieldType], yieldSig)) {
		return nil, fmt.Errorf("%w: %s.%s has the wrong type", ErrUnsupported, YieldModule, YieldImport)
	}
	if !hasYield {
		yieldType = uint32(len(types))
		for i, t := range types {
			if bytes.Equal(t, yieldSig) {
				yieldType = uint32(i)
				break
			}
		}
		if yieldType == uint32(len(types)) {
			adds[0] = addition{id: secType, n: 1, entries: yieldSig}
		}
		imp := appendName(nil, YieldModule)
		imp = appendName(imp, YieldImport)
		imp = appendU32(append(imp, 0x00), yieldType)
		adds[1] = addition{id: secImport, n: 1, entries: imp}
		yield = importedFuncs
		rn.from = importedFuncs
	}
	fuel := importedGlobals + definedGlobals
	check := checkCode(fuel, yield)

	res := &Result{HasStart: hasStart}
	// Room for the module and what instrumenting adds (about 1/8 of the
	// code, see rewriteCode): one allocation, not a doubling per section.
	out := append(make([]byte, 0, len(b)+len(b)/8+256), b[:8]...)
	emit := func(id byte, payload []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(payload)))
		out = append(out, payload...)
	}
	newGlobal := append([]byte{0x7F, 0x01, 0x41}, appendS32(nil, Period)...) // mut i32 = Period
	adds[2] = addition{id: secGlobal, n: 1, entries: append(newGlobal, 0x0B)}
	exports := appendName(nil, FuelGlobal)
	exports = appendU32(append(exports, 0x03), fuel)
	adds[3] = addition{id: secExport, n: 1, entries: exports}
	if hasStart {
		adds[3].n++
		adds[3].entries = appendName(adds[3].entries, StartExport)
		adds[3].entries = appendU32(append(adds[3].entries, 0x00), rn.fn(start))
	}
	// flush writes the sections to add (ones the module lacks) that
	// must come before a section of rank next.
	flush := func(next int) {
		for i := range adds {
			a := &adds[i]
			if a.n > 0 && !a.done && next > rank(a.id) {
				emit(a.id, append(appendU32(nil, a.n), a.entries...))
				a.done = true
			}
		}
	}
	for _, s := range secs {
		if s.ID != secCustom {
			flush(rank(s.ID))
		}
		p := s.Payload
		var err error
		if rn.active() {
			switch s.ID {
			case secExport:
				p, err = rn.exports(p)
			case secGlobal:
				p, err = rn.globals(p)
			case secElement:
				p, err = rn.elements(p)
			case secCustom:
				p, err = rn.names(p)
			}
			if err != nil {
				return nil, err
			}
		}
		switch s.ID {
		case secType, secImport, secGlobal, secExport:
			for i := range adds {
				if a := &adds[i]; a.id == s.ID && a.n > 0 {
					p = a.merge(p)
				}
			}
			emit(s.ID, p)
		case secStart:
			// dropped: exported as StartExport instead
		case secCode:
			base := len(out) + 1 + len(appendU32(nil, uint32(len(p))))
			p, n, err := rewriteCode(p, base, importedFuncs, check, rn, lim)
			if err != nil {
				return nil, err
			}
			res.Checks += n
			emit(secCode, p)
		default:
			if p != nil { // nil: a name section dropped (see names)
				emit(s.ID, p)
			}
		}
	}
	flush(1 << 30)
	var ver []byte
	ver = appendName(ver, CustomSection)
	ver = append(ver, fmt.Sprintf("version=%d", Version)...)
	emit(secCustom, ver)
	res.Bytes = out
	return res, nil
}

// yieldSig is sched_yield's type: [] -> [i32].
var yieldSig = []byte{0x60, 0x00, 0x01, 0x7F}

// addition is entries to append to a section (or to a new one).
type addition struct {
	id      byte
	n       uint32
	entries []byte
	done    bool
}

// merge appends the addition to an existing section's payload.
func (a *addition) merge(p []byte) []byte {
	r := reader{b: p}
	n, _ := r.u32() // read before, in the first pass
	out := appendU32(nil, n+a.n)
	out = append(out, p[r.off:]...)
	a.done = true
	return append(out, a.entries...)
}

// checkCode is the check inserted at loop headers and function entries:
//
//	global.get $fuel  i32.const 1  i32.sub  global.set $fuel
//	global.get $fuel  i32.const 0  i32.le_s
//	if
//	  call $sched_yield  drop    ;; the host refills $fuel, or leaves 0
//	  global.get $fuel  i32.eqz
//	  if  unreachable  end
//	end
func checkCode(fuel, yield uint32) []byte {
	var c []byte
	get := func() { c = appendU32(append(c, 0x23), fuel) }
	get()
	c = append(c, 0x41, 0x01, 0x6B)
	c = appendU32(append(c, 0x24), fuel)
	get()
	c = append(c, 0x41, 0x00, 0x4C, 0x04, 0x40)
	c = appendU32(append(c, 0x10), yield)
	c = append(c, 0x1A)
	get()
	return append(c, 0x45, 0x04, 0x40, 0x00, 0x0B, 0x0B)
}

// splitTypes returns the type section's entries, each as its bytes.
func splitTypes(p []byte) ([][]byte, error) {
	r := reader{b: p}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for range n {
		at := r.off
		form, err := r.byte()
		if err != nil {
			return nil, err
		}
		if form != 0x60 {
			return nil, fmt.Errorf("%w: type form %#x", ErrUnsupported, form)
		}
		for range 2 { // params, results
			k, err := r.u32()
			if err != nil {
				return nil, err
			}
			for range k {
				if err := r.valtype(); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, r.b[at:r.off])
	}
	return out, nil
}

type imports struct {
	funcs, globals   uint32
	yield, yieldType uint32
	hasYield         bool
}

func countImports(p []byte) (im imports, err error) {
	r := reader{b: p}
	n, err := r.u32()
	if err != nil {
		return im, err
	}
	for range n {
		mod, err := r.name()
		if err != nil {
			return im, err
		}
		name, err := r.name()
		if err != nil {
			return im, err
		}
		kind, err := r.byte()
		if err != nil {
			return im, err
		}
		switch kind {
		case 0x00: // func: type index
			var t uint32
			if t, err = r.u32(); err == nil && mod == YieldModule && name == YieldImport {
				im.yield, im.yieldType, im.hasYield = im.funcs, t, true
			}
			im.funcs++
		case 0x01: // table: reftype, limits
			if _, err = r.byte(); err == nil {
				err = r.limits()
			}
		case 0x02: // memory: limits
			err = r.limits()
		case 0x03: // global: valtype, mutability
			im.globals++
			_, err = r.bytes(2)
		default:
			return im, fmt.Errorf("%w: import kind %#x", ErrUnsupported, kind)
		}
		if err != nil {
			return im, err
		}
	}
	return im, nil
}

func checkExports(p []byte) error {
	r := reader{b: p}
	n, err := r.u32()
	if err != nil {
		return err
	}
	for range n {
		name, err := r.name()
		if err != nil {
			return err
		}
		if name == FuelGlobal || name == StartExport {
			return fmt.Errorf("%w: export %s", ErrReserved, name)
		}
		if _, err := r.byte(); err != nil {
			return err
		}
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}

// rewriteCode instruments every function body of a code section payload.
// base is the payload's offset in the module, for error offsets.
func rewriteCode(p []byte, base int, importedFuncs uint32, check []byte, rn renumber, lim Limits) ([]byte, int, error) {
	bodies, err := parseCode(p, base, importedFuncs, lim)
	if err != nil {
		return nil, 0, err
	}
	n := uint32(len(bodies))
	entry := recursive(bodies, importedFuncs)
	out := appendU32(make([]byte, 0, len(p)+len(p)/8), n)
	checks := 0
	var buf []byte
	for i, bd := range bodies {
		var c int
		buf, c = bd.rewrite(buf[:0], entry[i], check, rn)
		checks += c
		out = appendU32(out, uint32(len(buf)))
		out = append(out, buf...)
	}
	return out, checks, nil
}

// parseCode parses every function body of a code section payload,
// checking lim as it goes (before it reads what is over a bound).
func parseCode(p []byte, base int, importedFuncs uint32, lim Limits) ([]body, error) {
	r := reader{b: p}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	if err := over(-1, LimitFunctions, uint64(n), lim.MaxFunctions); err != nil {
		return nil, err
	}
	bodies := make([]body, 0, min(n, 1<<20))
	var cost uint64   // the sum of the squares of the functions' depths
	var locals uint64 // the sum of their locals
	for i := range n {
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		if err := over(int64(importedFuncs+i), LimitFunctionBytes, uint64(size), lim.MaxFunctionBytes); err != nil {
			return nil, err
		}
		at := r.off
		code, err := r.bytes(int(size))
		if err != nil {
			return nil, fmt.Errorf("%w: function body %d overruns the code section", ErrMalformed, i)
		}
		bd, err := parseBody(code, base+at, importedFuncs+i, lim)
		if err != nil {
			return nil, err
		}
		locals += bd.locals
		if err := over(int64(importedFuncs+i), LimitModuleLocals, locals, lim.MaxModuleLocals); err != nil {
			return nil, err
		}
		cost += uint64(bd.depth) * uint64(bd.depth)
		if err := over(int64(importedFuncs+i), LimitNestingCost, cost, lim.MaxNestingCost); err != nil {
			return nil, err
		}
		bodies = append(bodies, bd)
	}
	if r.off != len(p) {
		return nil, fmt.Errorf("%w: %d bytes after the last function body", ErrMalformed, len(p)-r.off)
	}
	return bodies, nil
}

// body is a parsed function body.
type body struct {
	code     []byte
	exprAt   int       // where the instructions start, after the locals
	loops    []int     // offsets just after each loop's block type
	refs     []funcRef // function indices (call, ref.func)
	indirect bool      // contains call_indirect
	depth    int       // the deepest nesting of blocks, loops and ifs
	locals   uint64    // declared locals
}

func parseBody(code []byte, base int, fn uint32, lim Limits) (body, error) {
	r := reader{b: code}
	nl, err := r.u32()
	if err != nil {
		return body{}, err
	}
	var locals uint64
	for range nl {
		k, err := r.u32()
		if err != nil {
			return body{}, err
		}
		locals += uint64(k)
		if err := over(int64(fn), LimitLocals, locals, lim.MaxLocals); err != nil {
			return body{}, err
		}
		if err := r.valtype(); err != nil {
			return body{}, err
		}
	}
	bd := body{code: code, exprAt: r.off, locals: locals}
	bd.loops, bd.refs, bd.indirect, bd.depth, err = scan(&r, base, fn, lim.MaxNestingDepth)
	return bd, err
}

// recursive reports, per body, whether it needs a check at its entry: a
// call tree without loops can still run for exponential time (fib(100)),
// and every such tree repeats a cycle of the call graph. Every cycle runs
// through a function in a strongly connected component of the direct
// calls (with more than one function, or calling itself), or through a
// function with a call_indirect; those get the entry check, the rest
// (most functions of a Go module) need none.
func recursive(bodies []body, importedFuncs uint32) []bool {
	n := len(bodies)
	need := make([]bool, n)
	succ := func(v int, yield func(int)) {
		for _, ref := range bodies[v].refs {
			if ref.call && ref.fn >= importedFuncs && int(ref.fn-importedFuncs) < n {
				yield(int(ref.fn - importedFuncs))
			}
		}
	}
	// Tarjan's algorithm, iterative: wasm modules have tens of thousands
	// of functions and deep call chains.
	index := make([]int, n)
	low := make([]int, n)
	on := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	type frame struct {
		v    int
		next []int
	}
	counter := 0
	for root := range n {
		if index[root] >= 0 {
			continue
		}
		var calls []frame
		push := func(v int) {
			index[v], low[v] = counter, counter
			counter++
			stack = append(stack, v)
			on[v] = true
			var next []int
			succ(v, func(w int) {
				if w == v {
					need[v] = true // calls itself
				}
				next = append(next, w)
			})
			calls = append(calls, frame{v: v, next: next})
		}
		push(root)
		for len(calls) > 0 {
			f := &calls[len(calls)-1]
			if len(f.next) > 0 {
				w := f.next[0]
				f.next = f.next[1:]
				if index[w] < 0 {
					push(w)
				} else if on[w] {
					low[f.v] = min(low[f.v], index[w])
				}
				continue
			}
			v := f.v
			calls = calls[:len(calls)-1]
			if len(calls) > 0 {
				u := calls[len(calls)-1].v
				low[u] = min(low[u], low[v])
			}
			if low[v] == index[v] {
				var comp []int
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					on[w] = false
					comp = append(comp, w)
					if w == v {
						break
					}
				}
				if len(comp) > 1 {
					for _, w := range comp {
						need[w] = true
					}
				}
			}
		}
	}
	for i, bd := range bodies {
		if bd.indirect {
			need[i] = true
		}
	}
	return need
}

// rewrite appends the instrumented body to out: locals unchanged, a
// check at entry if it needs one (see recursive; unless the body starts
// with a loop, whose check comes first anyway), a check right after every
// loop's block type (the loop's label is its start, so every iteration
// runs it), function indices renumbered.
func (bd body) rewrite(out []byte, entry bool, check []byte, rn renumber) ([]byte, int) {
	code, loops, refs := bd.code, bd.loops, bd.refs
	out = append(out, code[:bd.exprAt]...)
	checks := 0
	if entry && (len(loops) == 0 || code[bd.exprAt] != 0x03) {
		out = append(out, check...)
		checks++
	}
	prev := bd.exprAt
	for len(loops) > 0 || len(refs) > 0 && rn.active() {
		if len(loops) > 0 && (len(refs) == 0 || !rn.active() || loops[0] <= refs[0].at) {
			out = append(out, code[prev:loops[0]]...)
			out = append(out, check...)
			checks++
			prev, loops = loops[0], loops[1:]
			continue
		}
		ref := refs[0]
		out = append(out, code[prev:ref.at]...)
		out = appendU32(out, rn.fn(ref.fn))
		prev, refs = ref.end, refs[1:]
	}
	return append(out, code[prev:]...), checks
}

// funcRef is a function index in a body (of call or ref.func), at
// [at, end).
type funcRef struct {
	at, end int
	fn      uint32
	call    bool // call, not ref.func
}

// scan walks an expression to its end, returning the offsets just after
// each loop's block type, the function indices it holds, and whether it
// contains a call_indirect. A nesting deeper than maxDepth (0: unbounded)
// ends it with a *LimitError.
func scan(r *reader, base int, fn uint32, maxDepth int) (loops []int, refs []funcRef, indirect bool, deepest int, err error) {
	depth := 1 // the function's own block, which is not nesting
	for depth > 0 {
		if depth-1 > deepest {
			deepest = depth - 1
			if err := over(int64(fn), LimitNestingDepth, uint64(deepest), maxDepth); err != nil {
				return nil, nil, false, 0, err
			}
		}
		at := r.off
		op, err := r.byte()
		if err != nil {
			return nil, nil, false, 0, fmt.Errorf("%w: function %d: body ends inside an expression", ErrMalformed, fn)
		}
		unsupported := func(name string) error {
			return &OpcodeError{Func: fn, Offset: base + at, Opcode: name}
		}
		switch {
		case op == 0x00, op == 0x01, op == 0x0F, op == 0x1A, op == 0x1B, op == 0xD1,
			op >= 0x45 && op <= 0xC4:
			// no immediates
		case op == 0x02 || op == 0x04: // block, if
			err = r.blocktype()
			depth++
		case op == 0x03: // loop
			err = r.blocktype()
			loops = append(loops, r.off)
			depth++
		case op == 0x05: // else
		case op == 0x0B: // end
			depth--
		case op == 0x0C, op == 0x0D, // br, br_if
			op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
			_, err = r.u32()
		case op == 0x10, op == 0xD2: // call, ref.func
			ref := funcRef{at: r.off, call: op == 0x10}
			ref.fn, err = r.u32()
			ref.end = r.off
			refs = append(refs, ref)
		case op == 0x0E: // br_table
			var n uint32
			if n, err = r.u32(); err == nil {
				for i := uint32(0); i <= n && err == nil; i++ {
					_, err = r.u32()
				}
			}
		case op == 0x11: // call_indirect: type, table
			indirect = true
			if _, err = r.u32(); err == nil {
				_, err = r.u32()
			}
		case op == 0x1C: // select t*
			var n uint32
			if n, err = r.u32(); err == nil {
				for i := uint32(0); i < n && err == nil; i++ {
					err = r.valtype()
				}
			}
		case op >= 0x28 && op <= 0x3E: // loads, stores
			err = r.memarg()
		case op == 0x3F, op == 0x40: // memory.size, memory.grow
			_, err = r.u32()
		case op == 0x41:
			_, err = r.sleb(32)
		case op == 0x42:
			_, err = r.sleb(64)
		case op == 0x43:
			_, err = r.bytes(4)
		case op == 0x44:
			_, err = r.bytes(8)
		case op == 0xD0: // ref.null t
			err = r.valtype()
		case op == 0xFC:
			var sub uint32
			if sub, err = r.u32(); err != nil {
				break
			}
			switch {
			case sub <= 7: // saturating truncations
			case sub == 8, sub == 10, sub == 12, sub == 14: // memory.init, memory.copy, table.init, table.copy
				if _, err = r.u32(); err == nil {
					_, err = r.u32()
				}
			case sub == 9, sub == 11, sub == 13, sub == 15, sub == 16, sub == 17:
				_, err = r.u32()
			default:
				return nil, nil, false, 0, unsupported(fmt.Sprintf("0xfc %d", sub))
			}
		case op == 0xFD:
			var sub uint32
			if sub, err = r.u32(); err != nil {
				break
			}
			switch {
			case sub <= 11, sub == 92, sub == 93: // v128 loads and stores
				err = r.memarg()
			case sub == 12, sub == 13: // v128.const, i8x16.shuffle
				_, err = r.bytes(16)
			case sub >= 21 && sub <= 34: // extract/replace lane
				_, err = r.byte()
			case sub >= 84 && sub <= 91: // load/store lane
				if err = r.memarg(); err == nil {
					_, err = r.byte()
				}
			case sub <= 255: // the rest of SIMD takes no immediates
			default:
				return nil, nil, false, 0, unsupported(fmt.Sprintf("0xfd %d (relaxed SIMD)", sub))
			}
		default:
			return nil, nil, false, 0, unsupported(opName(op))
		}
		if err != nil {
			return nil, nil, false, 0, fmt.Errorf("function %d at offset %#x: %w", fn, base+at, err)
		}
	}
	if r.off != len(r.b) {
		return nil, nil, false, 0, fmt.Errorf("%w: function %d: %d bytes after its end", ErrMalformed, fn, len(r.b)-r.off)
	}
	return loops, refs, indirect, deepest, nil
}

func opName(op byte) string {
	names := map[byte]string{
		0x06: "try", 0x07: "catch", 0x08: "throw", 0x09: "rethrow", 0x0A: "throw_ref",
		0x12: "return_call", 0x13: "return_call_indirect", 0x14: "call_ref", 0x15: "return_call_ref",
		0x18: "delegate", 0x19: "catch_all", 0x1F: "try_table", 0xFB: "gc prefix", 0xFE: "atomic prefix",
	}
	if n, ok := names[op]; ok {
		return fmt.Sprintf("%#02x (%s)", op, n)
	}
	return fmt.Sprintf("%#02x", op)
}
