package instrument

import (
	"bytes"
	"errors"
	"testing"
)

// The rewriters of renumber.go, each on a payload covering every kind of
// entry it reads: the exact bytes out (function indices at or above from
// shifted, everything else as it was), and the errors.

// cat joins byte pieces.
func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// vecOf is a vector: its count, then its entries.
func vecOf(entries ...[]byte) []byte {
	return cat(append([][]byte{appendU32(nil, uint32(len(entries)))}, entries...)...)
}

func name(s string) []byte { return appendName(nil, s) }

func u32(v uint32) []byte { return appendU32(nil, v) }

// rn2 shifts function indices 2 and up.
var rn2 = renumber{from: 2}

func checkRewrite(t *testing.T, what string, rewrite func([]byte) ([]byte, error), in, want []byte) {
	t.Helper()
	got, err := rewrite(in)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s:\n got % x\nwant % x", what, got, want)
	}
}

func checkError(t *testing.T, what string, rewrite func([]byte) ([]byte, error), in []byte, want error) {
	t.Helper()
	got, err := rewrite(in)
	if !errors.Is(err, want) || got != nil {
		t.Fatalf("%s: got % x, %v; want nil, %v", what, got, err, want)
	}
}

func TestRenumberExports(t *testing.T) {
	in := vecOf(
		cat(name("a"), []byte{0x00}, u32(1)),     // func below from
		cat(name("b"), []byte{0x00}, u32(2)),     // func at from
		cat(name("c"), []byte{0x00}, u32(300)),   // func, two bytes
		cat(name("t"), []byte{0x01}, u32(5)),     // table
		cat(name("m"), []byte{0x02}, u32(5)),     // memory
		cat(name("g"), []byte{0x03}, u32(5)),     // global
		cat(name("p"), []byte{0x00, 0x85, 0x00}), // func 5, padded
	)
	want := vecOf(
		cat(name("a"), []byte{0x00}, u32(1)),
		cat(name("b"), []byte{0x00}, u32(3)),
		cat(name("c"), []byte{0x00}, u32(301)),
		cat(name("t"), []byte{0x01}, u32(5)),
		cat(name("m"), []byte{0x02}, u32(5)),
		cat(name("g"), []byte{0x03}, u32(5)),
		cat(name("p"), []byte{0x00}, u32(6)),
	)
	checkRewrite(t, "exports", rn2.exports, in, want)
	checkRewrite(t, "no exports", rn2.exports, []byte{0x00}, []byte{0x00})
	checkError(t, "truncated", rn2.exports, in[:len(in)-1], ErrMalformed)
	checkError(t, "empty", rn2.exports, nil, ErrMalformed)
}

func TestRenumberGlobals(t *testing.T) {
	v128 := cat([]byte{0x7B, 0x00, 0xFD, 0x0C}, bytes.Repeat([]byte{0xAB}, 16), []byte{0x0B})
	in := vecOf(
		[]byte{0x7F, 0x01, 0x41, 0x05, 0x0B},                   // mut i32 = 5
		[]byte{0x7E, 0x00, 0x42, 0x80, 0x7F, 0x0B},             // i64 = -128
		[]byte{0x7D, 0x00, 0x43, 1, 2, 3, 4, 0x0B},             // f32
		[]byte{0x7C, 0x00, 0x44, 1, 2, 3, 4, 5, 6, 7, 8, 0x0B}, // f64
		[]byte{0x7F, 0x00, 0x23, 0x00, 0x0B},                   // global.get 0
		[]byte{0x70, 0x00, 0xD0, 0x70, 0x0B},                   // ref.null func
		[]byte{0x70, 0x00, 0xD2, 0x01, 0x0B},                   // ref.func 1
		[]byte{0x70, 0x00, 0xD2, 0x02, 0x0B},                   // ref.func 2
		[]byte{0x7F, 0x00, 0x41, 0x01, 0x41, 0x02, 0x6A, 0x0B}, // extended: 1 + 2
		v128,
	)
	want := vecOf(
		[]byte{0x7F, 0x01, 0x41, 0x05, 0x0B},
		[]byte{0x7E, 0x00, 0x42, 0x80, 0x7F, 0x0B},
		[]byte{0x7D, 0x00, 0x43, 1, 2, 3, 4, 0x0B},
		[]byte{0x7C, 0x00, 0x44, 1, 2, 3, 4, 5, 6, 7, 8, 0x0B},
		[]byte{0x7F, 0x00, 0x23, 0x00, 0x0B},
		[]byte{0x70, 0x00, 0xD0, 0x70, 0x0B},
		[]byte{0x70, 0x00, 0xD2, 0x01, 0x0B},
		[]byte{0x70, 0x00, 0xD2, 0x03, 0x0B},
		[]byte{0x7F, 0x00, 0x41, 0x01, 0x41, 0x02, 0x6A, 0x0B},
		v128,
	)
	checkRewrite(t, "globals", rn2.globals, in, want)
	checkError(t, "call in a constant expression", rn2.globals, vecOf([]byte{0x7F, 0x00, 0x10, 0x00, 0x0B}), ErrUnsupported)
	checkError(t, "v128 other than const", rn2.globals, vecOf([]byte{0x7B, 0x00, 0xFD, 0x0D, 0x0B}), ErrUnsupported)
	checkError(t, "GC value type", rn2.globals, vecOf([]byte{0x64, 0x00, 0xD0, 0x70, 0x0B}), ErrUnsupported)
	checkError(t, "no end", rn2.globals, vecOf([]byte{0x7F, 0x00, 0x41, 0x05}), ErrMalformed)
}

func TestRenumberElements(t *testing.T) {
	offset := []byte{0x41, 0x00, 0x0B} // i32.const 0
	funcs := vecOf(u32(1), u32(2), u32(200))
	funcsOut := vecOf(u32(1), u32(3), u32(201))
	exprs := vecOf([]byte{0xD2, 0x01, 0x0B}, []byte{0xD2, 0x02, 0x0B}, []byte{0xD0, 0x70, 0x0B})
	exprsOut := vecOf([]byte{0xD2, 0x01, 0x0B}, []byte{0xD2, 0x03, 0x0B}, []byte{0xD0, 0x70, 0x0B})
	in := vecOf(
		cat(u32(0), []byte{0x23, 0x00, 0x0B}, funcs), // active, table 0, offset global.get 0
		cat(u32(1), []byte{0x00}, funcs),             // passive, elemkind
		cat(u32(2), u32(1), offset, []byte{0x00}, funcs),
		cat(u32(3), []byte{0x00}, funcs), // declarative
		cat(u32(4), offset, exprs),
		cat(u32(5), []byte{0x70}, exprs),
		cat(u32(6), u32(1), offset, []byte{0x70}, exprs),
		cat(u32(7), []byte{0x70}, exprs),
		cat(u32(0), offset, vecOf()), // no functions
	)
	want := vecOf(
		cat(u32(0), []byte{0x23, 0x00, 0x0B}, funcsOut),
		cat(u32(1), []byte{0x00}, funcsOut),
		cat(u32(2), u32(1), offset, []byte{0x00}, funcsOut),
		cat(u32(3), []byte{0x00}, funcsOut),
		cat(u32(4), offset, exprsOut),
		cat(u32(5), []byte{0x70}, exprsOut),
		cat(u32(6), u32(1), offset, []byte{0x70}, exprsOut),
		cat(u32(7), []byte{0x70}, exprsOut),
		cat(u32(0), offset, vecOf()),
	)
	checkRewrite(t, "elements", rn2.elements, in, want)
	checkError(t, "flags 8", rn2.elements, vecOf(cat(u32(8), offset, funcs)), ErrUnsupported)
	checkError(t, "truncated functions", rn2.elements, vecOf(cat(u32(0), offset, funcs[:2])), ErrMalformed)
	checkError(t, "truncated expressions", rn2.elements, vecOf(cat(u32(4), offset, exprs[:4])), ErrMalformed)
	checkError(t, "no table index", rn2.elements, vecOf(u32(2)), ErrMalformed)
}

func TestRenumberNames(t *testing.T) {
	sub := func(id byte, p []byte) []byte { return cat([]byte{id}, u32(uint32(len(p))), p) }
	// An indirect map's inner maps are copied byte for byte, a padded
	// count included; its outer indices are shifted.
	inner := cat([]byte{0x81, 0x00}, u32(0), name("x")) // 1 entry, count padded
	funcNames := vecOf(cat(u32(1), name("one")), cat(u32(2), name("two")), cat(u32(130), name("far")))
	funcNamesOut := vecOf(cat(u32(1), name("one")), cat(u32(3), name("two")), cat(u32(131), name("far")))
	locals := vecOf(cat(u32(0), inner), cat(u32(4), inner), cat(u32(5), vecOf()))
	localsOut := vecOf(cat(u32(0), inner), cat(u32(5), inner), cat(u32(6), vecOf()))
	header := name("name")
	in := cat(header,
		sub(0, name("mod")),  // module name: copied
		sub(1, funcNames),    // function names
		sub(2, locals),       // local names
		sub(3, locals),       // label names
		sub(4, []byte{0xFF}), // type names: copied, not parsed
		sub(1, vecOf()),      // empty map
	)
	want := cat(header,
		sub(0, name("mod")),
		sub(1, funcNamesOut),
		sub(2, localsOut),
		sub(3, localsOut),
		sub(4, []byte{0xFF}),
		sub(1, vecOf()),
	)
	checkRewrite(t, "names", rn2.names, in, want)
	checkRewrite(t, "only the header", rn2.names, header, header)

	other := cat(name("producers"), []byte{1, 2, 3})
	got, err := rn2.names(other)
	if err != nil || &got[0] != &other[0] || len(got) != len(other) {
		t.Fatalf("another custom section: got % x, %v; want it returned as it is", got, err)
	}
	got, err = rn2.names([]byte{0x80})
	if err != nil || !bytes.Equal(got, []byte{0x80}) {
		t.Fatalf("a custom section without a name: got % x, %v; want it returned as it is", got, err)
	}

	// A name section it cannot parse is dropped: nil, no error.
	for what, p := range map[string][]byte{
		"subsection overruns":    cat(header, []byte{1, 10, 0}),
		"no subsection size":     cat(header, []byte{1}),
		"map entry truncated":    cat(header, sub(1, vecOf(cat(u32(1), []byte{5, 'a'})))),
		"bytes after the map":    cat(header, sub(1, cat(funcNames, []byte{0}))),
		"inner map truncated":    cat(header, sub(2, vecOf(cat(u32(1), []byte{2}, u32(0), name("x"))))),
		"name not UTF-8":         cat(header, sub(1, vecOf(cat(u32(1), []byte{1, 0xFF})))),
		"indirect map, no count": cat(header, sub(2, []byte{})),
	} {
		if got, err := rn2.names(p); got != nil || err != nil {
			t.Fatalf("%s: got % x, %v; want nil, nil (dropped)", what, got, err)
		}
	}
}
