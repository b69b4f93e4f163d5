package instrument_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/proteanhq/protean-host/internal/instrument"
)

// gen builds a valid module from fuzz bytes: a few functions (i32) ->
// i32 of nested blocks, bounded loops, if/else, br_if, br_table, direct
// and indirect calls (only to later functions, so every call tree ends),
// locals, a global, memory loads, stores and fills, sign extension and
// saturating conversion. With yield, it imports sched_yield first, as Go
// modules do; without, the instrumentation adds the import and renumbers.
type gen struct {
	in    []byte
	fn    int // function being generated (0-based among defined)
	nfn   int
	depth int
	loops int // loop counters used in this function
}

const (
	genLocals   = 3 // param + 2 plain locals; loop counters follow
	genCounters = 6
)

func (g *gen) next() int {
	if len(g.in) == 0 {
		return 0
	}
	c := g.in[0]
	g.in = g.in[1:]
	return int(c)
}

func uleb(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func sleb(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// funcIndex is defined function i's index (after the imports).
func (g *gen) funcIndex(i int, yield bool) uint32 {
	if yield {
		return uint32(i + 1)
	}
	return uint32(i)
}

func (g *gen) expr(b []byte, yield bool) []byte {
	g.depth++
	defer func() { g.depth-- }()
	k := g.next()
	if g.depth > 4 {
		k %= 3
	}
	switch k % 12 {
	case 0:
		return sleb(append(b, 0x41), int32(int8(g.next())))
	case 1:
		return append(b, 0x20, byte(g.next()%genLocals))
	case 2:
		return append(b, 0x23, 0x00) // global.get 0
	case 3:
		ops := []byte{0x6A, 0x6B, 0x6C, 0x71, 0x72, 0x73, 0x74, 0x75, 0x77, 0x46, 0x49}
		b = g.expr(b, yield)
		b = g.expr(b, yield)
		return append(b, ops[g.next()%len(ops)])
	case 4:
		ops := []byte{0x45, 0xC0, 0x67}
		b = g.expr(b, yield)
		return append(b, ops[g.next()%len(ops)])
	case 5: // load8_u from a masked address
		b = g.expr(b, yield)
		return append(b, 0x41, 0xFF, 0x1F, 0x71, 0x2D, 0x00, 0x00)
	case 6: // call a later function
		if g.fn+1 >= g.nfn {
			return append(b, 0x41, 0x07)
		}
		b = g.expr(b, yield)
		callee := g.fn + 1 + g.next()%(g.nfn-g.fn-1)
		return uleb(append(b, 0x10), g.funcIndex(callee, yield))
	case 7: // call_indirect the table's one entry (the last function)
		if g.fn+1 >= g.nfn {
			return append(b, 0x41, 0x09)
		}
		b = g.expr(b, yield)
		return append(b, 0x41, 0x00, 0x11, 0x00, 0x00)
	case 8: // select
		b = g.expr(b, yield)
		b = g.expr(b, yield)
		b = g.expr(b, yield)
		return append(b, 0x1B)
	case 9: // saturating conversion through f32
		b = g.expr(b, yield)
		return append(b, 0xB2, 0x43, 0x00, 0x00, 0x00, 0x3F, 0x94, 0xFC, 0x00) // * 0.5
	case 10: // block with a result
		b = append(b, 0x02, 0x7F)
		b = g.stmts(b, yield)
		b = g.expr(b, yield)
		return append(b, 0x0B)
	default: // if/else with a result
		b = g.expr(b, yield)
		b = append(b, 0x04, 0x7F)
		b = g.expr(b, yield)
		b = append(b, 0x05)
		b = g.expr(b, yield)
		return append(b, 0x0B)
	}
}

func (g *gen) stmts(b []byte, yield bool) []byte {
	n := g.next() % 3
	for range n {
		b = g.stmt(b, yield)
	}
	return b
}

func (g *gen) stmt(b []byte, yield bool) []byte {
	g.depth++
	defer func() { g.depth-- }()
	k := g.next()
	if g.depth > 4 {
		k %= 3
	}
	switch k % 6 {
	case 0:
		b = g.expr(b, yield)
		return append(b, 0x21, byte(1+g.next()%(genLocals-1)))
	case 1:
		b = g.expr(b, yield)
		return append(b, 0x24, 0x00)
	case 2: // store8 at a masked address
		b = g.expr(b, yield)
		b = append(b, 0x41, 0xFF, 0x1F, 0x71)
		b = g.expr(b, yield)
		return append(b, 0x3A, 0x00, 0x00)
	case 3: // memory.fill
		b = append(b, 0x41)
		b = sleb(b, int32(g.next()*8))
		b = g.expr(b, yield)
		b = append(b, 0x41)
		b = sleb(b, int32(g.next()%64))
		return append(b, 0xFC, 0x0B, 0x00)
	case 4: // a bounded loop with an early exit: block loop … end end
		if g.loops == genCounters {
			return b
		}
		c := byte(genLocals + g.loops)
		g.loops++
		b = append(b, 0x41, byte(1+g.next()%6), 0x21, c) // c = 1..6
		b = append(b, 0x02, 0x40, 0x03, 0x40)
		b = g.stmts(b, yield)
		b = g.expr(b, yield)
		b = append(b, 0x0D, 0x01)                                     // br_if 1: exit
		b = append(b, 0x20, c, 0x41, 0x01, 0x6B, 0x22, c, 0x0D, 0x00) // --c; br_if 0
		return append(b, 0x0B, 0x0B)
	default: // br_table over two nested blocks
		b = append(b, 0x02, 0x40, 0x02, 0x40, 0x02, 0x40)
		b = g.expr(b, yield)
		b = append(b, 0x0E, 0x02, 0x00, 0x01, 0x02, 0x0B)
		b = g.stmts(b, yield)
		b = append(b, 0x0B)
		b = g.stmts(b, yield)
		return append(b, 0x0B)
	}
}

func section(id byte, payload []byte) []byte {
	return append(uleb([]byte{id}, uint32(len(payload))), payload...)
}

// module returns the generated module.
func (g *gen) module(yield bool) []byte {
	g.nfn = 1 + g.next()%3
	m := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	m = append(m, section(1, []byte{0x02, 0x60, 0x01, 0x7F, 0x01, 0x7F, 0x60, 0x00, 0x01, 0x7F})...)
	if yield {
		imp := append([]byte{0x01}, uleb(nil, uint32(len(instrument.YieldModule)))...)
		imp = append(imp, instrument.YieldModule...)
		imp = uleb(imp, uint32(len(instrument.YieldImport)))
		imp = append(imp, instrument.YieldImport...)
		m = append(m, section(2, append(imp, 0x00, 0x01))...)
	}
	funcs := uleb(nil, uint32(g.nfn))
	for range g.nfn {
		funcs = append(funcs, 0x00)
	}
	m = append(m, section(3, funcs)...)
	m = append(m, section(4, []byte{0x01, 0x70, 0x00, 0x01})...)             // table: 1 funcref
	m = append(m, section(5, []byte{0x01, 0x00, 0x01})...)                   // memory: 1 page
	m = append(m, section(6, []byte{0x01, 0x7F, 0x01, 0x41, 0x05, 0x0B})...) // global 0: mut i32 = 5
	m = append(m, section(7, uleb([]byte{0x01, 0x03, 'r', 'u', 'n', 0x00}, g.funcIndex(0, yield)))...)
	m = append(m, section(9, uleb([]byte{0x01, 0x00, 0x41, 0x00, 0x0B, 0x01}, g.funcIndex(g.nfn-1, yield)))...)
	var code []byte
	for i := range g.nfn {
		g.fn, g.loops = i, 0
		body := []byte{0x02, 0x02, 0x7F, genCounters, 0x7F} // locals: 2 i32, counters
		body = g.stmts(body, yield)
		body = g.expr(body, yield)
		body = append(body, 0x0B)
		code = append(uleb(code, uint32(len(body))), body...)
	}
	m = append(m, section(10, append(uleb(nil, uint32(g.nfn)), code...))...)
	return m
}

// run calls run(arg) for each arg on a fresh instance of b, returning
// each result or trap, and the final memory and global.
func run(tb testing.TB, rt wazero.Runtime, b []byte, args []uint32) []string {
	tb.Helper()
	ctx := context.Background()
	var fuel api.MutableGlobal
	mod, err := rt.InstantiateWithConfig(ctx, b, wazero.NewModuleConfig().WithName("").WithStartFunctions().WithOsyield(func() {
		fuel.Set(instrument.Period)
	}))
	if err != nil {
		tb.Fatalf("instantiate: %v", err)
	}
	defer mod.Close(ctx)
	fuel, _ = mod.ExportedGlobal(instrument.FuelGlobal).(api.MutableGlobal)
	var out []string
	for _, a := range args {
		res, err := mod.ExportedFunction("run").Call(ctx, uint64(a))
		if err != nil {
			out = append(out, "trap")
			continue
		}
		out = append(out, fmt.Sprint(res))
	}
	mem, _ := mod.Memory().Read(0, 8192)
	return append(out, fmt.Sprintf("%x", mem))
}

// FuzzRewriteKeepsBehaviour: a rewritten generated module compiles and
// gives the original's results, traps, memory and globals.
func FuzzRewriteKeepsBehaviour(f *testing.F) {
	for _, seed := range []string{"", "\x01\x04\x03\x05\x06\x07", "\x02\x0a\x04\x04\x02\x01\x03\x0b\x06\x06\x07\x09\x08",
		"\x02\x02\x05\x04\x04\x03\x03\x01\x0b\x0a\x05\x05\x05\x06\x06\x06\x07\x07\x07\x08\x08\x09\x09",
		"\x01\x02\x04\x04\x0a\x02\x05\x03\x0c\x11\x06\x01\x02\x03", "\x00\x05\x05\x05\x05\x05\x05\x05"} {
		f.Add([]byte(seed), true, uint32(3))
		f.Add([]byte(seed), false, uint32(0xFFFFFFF0))
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	f.Cleanup(func() { _ = rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	f.Fuzz(func(t *testing.T, in []byte, yield bool, arg uint32) {
		orig := (&gen{in: in}).module(yield)
		if err := compiles(ctx, rt, orig); err != nil {
			t.Fatalf("generator made an invalid module: %v", err)
		}
		res, err := instrument.Module(orig, instrument.Limits{})
		if err != nil {
			t.Fatalf("rewrite: %v", err)
		}
		args := []uint32{arg, 0, 1, 0x7FFFFFFF}
		want := run(t, rt, orig, args)
		got := run(t, rt, res.Bytes, args)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("rewritten module differs:\n got %v\nwant %v", got[:len(args)], want[:len(args)])
		}
	})
}

// FuzzModuleBytes: on any bytes Module returns an error or a module, never
// panics; a module wazero compiles rewrites into one wazero compiles.
func FuzzModuleBytes(f *testing.F) {
	f.Add(sumLoop)
	f.Add((&gen{in: []byte("\x02\x0a\x04\x04\x02\x01\x03\x0b\x06\x06\x07\x09\x08")}).module(false))
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	f.Cleanup(func() { _ = rt.Close(ctx) })
	f.Fuzz(func(t *testing.T, b []byte) {
		// The host hands wazero only what Module accepted (malformed
		// modules are refused; see checkCount), so the fuzzer does too.
		res, err := instrument.Module(b, instrument.Limits{})
		if err != nil || compiles(ctx, rt, b) != nil {
			return
		}
		if err := compiles(ctx, rt, res.Bytes); err != nil {
			t.Fatalf("a valid module rewrote into an invalid one: %v", err)
		}
	})
}

// compiles reports whether wazero compiles b, and frees what it compiled:
// a runtime keeps every compiled module until it is closed, and a fuzz
// worker that kept tens of thousands of them ran out of memory and died
// ("fuzzing process hung or terminated unexpectedly").
func compiles(ctx context.Context, rt wazero.Runtime, b []byte) error {
	cm, err := rt.CompileModule(ctx, b)
	if err != nil {
		return err
	}
	return cm.Close(ctx)
}
