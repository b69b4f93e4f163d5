package wasmbuild

import (
	"crypto/rand"

	"github.com/proteanhq/protean-host/abi"
)

// Raw WebAssembly, written byte by byte, for the hostile modules Go cannot
// produce: tables that grow, and a compile bomb.

func uleb(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func sleb(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// Section encodes one module section.
func Section(id byte, body []byte) []byte {
	return append(uleb([]byte{id}, uint64(len(body))), body...)
}

// RawModule is a module with one funcref table (tableMax < 0 for no
// maximum) and one export, protean_manifest () -> i32, whose body is code.
func RawModule(tableMin uint64, tableMax int64, code []byte) []byte {
	m := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	m = append(m, Section(1, []byte{1, 0x60, 0, 1, 0x7f})...) // type 0: () -> i32
	m = append(m, Section(3, []byte{1, 0})...)                // func 0: type 0
	table := []byte{1, 0x70}
	if tableMax < 0 {
		table = uleb(append(table, 0), tableMin)
	} else {
		table = uleb(uleb(append(table, 1), tableMin), uint64(tableMax))
	}
	m = append(m, Section(4, table)...)
	name := abi.ExportManifest
	exp := uleb([]byte{1}, uint64(len(name)))
	exp = append(append(exp, name...), 0, 0) // func 0
	m = append(m, Section(7, exp)...)
	body := append([]byte{0}, code...) // no locals
	body = append(body, 0x0b)
	fn := uleb(nil, uint64(len(body)))
	return append(m, Section(10, append([]byte{1}, append(fn, body...)...))...)
}

// TableGrower is a module whose manifest grows its table (maximum max, or
// none if max < 0) by n elements and returns 7 if the runtime refused
// (table.grow answered -1), 9 if it grew.
func TableGrower(max int64, n int64) []byte {
	code := []byte{0xd0, 0x70}                                    // ref.null func
	code = sleb(append(code, 0x41), n)                            // i32.const n
	code = append(code, 0xfc, 0x0f, 0x00)                         // table.grow 0
	code = append(code, 0x41, 0x7f, 0x46)                         // i32.const -1; i32.eq
	code = append(code, 0x04, 0x7f, 0x41, 7, 0x05, 0x41, 9, 0x0b) // if (result i32) 7 else 9 end
	return RawModule(0, max, code)
}

// CompileBomb is a valid module of depth nested blocks. wazero's compile
// time grows with the square of the depth: 30000 take ~13 s alone, 60000
// about a minute. A random custom section makes its bytes, and so its
// compilation-cache key, unique, so no cache ever answers for it.
func CompileBomb(depth int) []byte {
	code := make([]byte, 0, 3*depth+4)
	for range depth {
		code = append(code, 0x02, 0x40)
	}
	for range depth {
		code = append(code, 0x0b)
	}
	code = append(code, 0x41, 0) // i32.const 0
	m := RawModule(0, 1, code)
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	custom := append(uleb(nil, 4), "salt"...)
	return append(m, Section(0, append(custom, salt...))...)
}

// Nested is a function body (no locals) of depth nested blocks returning
// 0: the shape of a compile bomb, for RawFuncs.
func Nested(depth int) []byte {
	code := make([]byte, 0, 2*depth+depth+4)
	code = append(code, 0) // no locals
	for range depth {
		code = append(code, 0x02, 0x40)
	}
	for range depth {
		code = append(code, 0x0b)
	}
	return append(code, 0x41, 0, 0x0b) // i32.const 0; end
}

// WithLocals is a function body declaring n i32 locals and returning 0,
// for RawFuncs.
func WithLocals(n uint64) []byte {
	return append(uleb([]byte{1}, n), 0x7f, 0x41, 0, 0x0b)
}

// RawFuncs is a module of the given function bodies (each with its locals
// and its final end), all of type () -> i32; the first is exported as the
// manifest. Its bytes are unique (a random custom section), so no
// compilation cache answers for it.
func RawFuncs(bodies ...[]byte) []byte {
	m := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	m = append(m, Section(1, []byte{1, 0x60, 0, 1, 0x7f})...) // type 0: () -> i32
	funcs := uleb(nil, uint64(len(bodies)))
	code := uleb(nil, uint64(len(bodies)))
	for _, b := range bodies {
		funcs = append(funcs, 0)
		code = append(uleb(code, uint64(len(b))), b...)
	}
	m = append(m, Section(3, funcs)...)
	name := abi.ExportManifest
	exp := uleb([]byte{1}, uint64(len(name)))
	exp = append(append(exp, name...), 0, 0) // func 0
	m = append(m, Section(7, exp)...)
	m = append(m, Section(10, code)...)
	salt := make([]byte, 16)
	_, _ = rand.Read(salt)
	return append(m, Section(0, append(append(uleb(nil, 4), "salt"...), salt...))...)
}

// StartLoop is a module whose start function (the start section, run at
// instantiation) loops forever; its manifest would return 0.
func StartLoop() []byte {
	m := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	m = append(m, Section(1, []byte{2, 0x60, 0, 1, 0x7f, 0x60, 0, 0})...) // type 0: () -> i32; type 1: ()
	m = append(m, Section(3, []byte{2, 0, 1})...)                         // func 0: type 0; func 1: type 1
	name := abi.ExportManifest
	exp := uleb([]byte{1}, uint64(len(name)))
	exp = append(append(exp, name...), 0, 0)
	m = append(m, Section(7, exp)...)
	m = append(m, Section(8, []byte{1})...)          // start: func 1
	f0 := []byte{0, 0x41, 0, 0x0b}                   // i32.const 0
	f1 := []byte{0, 0x03, 0x40, 0x0c, 0, 0x0b, 0x0b} // loop br 0 end
	code := []byte{2}
	code = append(uleb(code, uint64(len(f0))), f0...)
	code = append(uleb(code, uint64(len(f1))), f1...)
	return append(m, Section(10, code)...)
}
