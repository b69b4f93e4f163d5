package instrument

import "fmt"

// renumber shifts function indices at or above from by one: the index
// space after an import is added at the end of the imports. from is
// ^uint32(0) when nothing moves.
type renumber struct{ from uint32 }

func (rn renumber) active() bool { return rn.from != ^uint32(0) }

func (rn renumber) fn(f uint32) uint32 {
	if f >= rn.from {
		return f + 1
	}
	return f
}

// vec copies the vector at r onto out: its count (re-encoded), then each
// entry as entry reads it from r and appends its rewrite to out, returning
// the grown out. Each rewriter below is this walk over its section's
// entries, or over a vector within one.
func vec(r *reader, out []byte, entry func(r *reader, out []byte) ([]byte, error)) ([]byte, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	out = appendU32(out, n)
	for range n {
		if out, err = entry(r, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// exports rewrites the export section's function indices.
func (rn renumber) exports(p []byte) ([]byte, error) {
	return vec(&reader{b: p}, nil, func(r *reader, out []byte) ([]byte, error) {
		name, err := r.name()
		if err != nil {
			return nil, err
		}
		kind, err := r.byte()
		if err != nil {
			return nil, err
		}
		idx, err := r.u32()
		if err != nil {
			return nil, err
		}
		if kind == 0x00 {
			idx = rn.fn(idx)
		}
		return appendU32(append(appendName(out, name), kind), idx), nil
	})
}

// globals rewrites ref.func in the global section's initialisers.
func (rn renumber) globals(p []byte) ([]byte, error) {
	return vec(&reader{b: p}, nil, func(r *reader, out []byte) ([]byte, error) {
		at := r.off
		if err := r.valtype(); err != nil {
			return nil, err
		}
		if _, err := r.byte(); err != nil { // mutability
			return nil, err
		}
		return rn.constExpr(r, append(out, r.b[at:r.off]...))
	})
}

// constExpr copies a constant expression, shifting ref.func.
func (rn renumber) constExpr(r *reader, out []byte) ([]byte, error) {
	for {
		at := r.off
		op, err := r.byte()
		if err != nil {
			return nil, err
		}
		switch op {
		case 0x0B: // end
			return append(out, op), nil
		case 0xD2: // ref.func
			f, err := r.u32()
			if err != nil {
				return nil, err
			}
			out = appendU32(append(out, op), rn.fn(f))
			continue
		case 0x41:
			_, err = r.sleb(32)
		case 0x42:
			_, err = r.sleb(64)
		case 0x43:
			_, err = r.bytes(4)
		case 0x44:
			_, err = r.bytes(8)
		case 0x23: // global.get
			_, err = r.u32()
		case 0xD0: // ref.null
			_, err = r.byte()
		case 0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E: // extended constant expressions
		case 0xFD: // v128.const
			var sub uint32
			if sub, err = r.u32(); err == nil && sub != 12 {
				err = fmt.Errorf("%w: 0xfd %d in a constant expression", ErrUnsupported, sub)
			} else if err == nil {
				_, err = r.bytes(16)
			}
		default:
			err = fmt.Errorf("%w: opcode %#02x in a constant expression", ErrUnsupported, op)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r.b[at:r.off]...)
	}
}

// funcIndex copies a function index, shifted.
func (rn renumber) funcIndex(r *reader, out []byte) ([]byte, error) {
	f, err := r.u32()
	if err != nil {
		return nil, err
	}
	return appendU32(out, rn.fn(f)), nil
}

// elements rewrites the element section's function indices and ref.func.
func (rn renumber) elements(p []byte) ([]byte, error) {
	return vec(&reader{b: p}, nil, func(r *reader, out []byte) ([]byte, error) {
		flags, err := r.u32()
		if err != nil {
			return nil, err
		}
		if flags > 7 {
			return nil, fmt.Errorf("%w: element segment flags %d", ErrUnsupported, flags)
		}
		out = appendU32(out, flags)
		if flags == 2 || flags == 6 { // table index
			var table uint32
			table, err = r.u32()
			out = appendU32(out, table)
		}
		if err == nil && flags&1 == 0 { // active: offset
			out, err = rn.constExpr(r, out)
		}
		if err == nil && flags&3 != 0 { // element kind or reference type
			var kind byte
			kind, err = r.byte()
			out = append(out, kind)
		}
		if err != nil {
			return nil, err
		}
		if flags&4 == 0 {
			return vec(r, out, rn.funcIndex)
		}
		return vec(r, out, rn.constExpr)
	})
}

// names rewrites the function indices of the "name" custom section
// (function, local and label names); other custom sections are returned
// as they are. A name section it cannot parse is dropped (nil): names
// only label stack traces, and stale ones would mislabel them.
func (rn renumber) names(p []byte) ([]byte, error) {
	r := reader{b: p}
	if name, err := r.name(); err != nil || name != "name" {
		return p, nil
	}
	out := append([]byte(nil), p[:r.off]...)
	for r.off < len(p) {
		id, err := r.byte()
		if err != nil {
			return nil, nil
		}
		size, err := r.u32()
		if err != nil {
			return nil, nil
		}
		sub, err := r.bytes(int(size))
		if err != nil {
			return nil, nil
		}
		if id == 1 || id == 2 || id == 3 {
			if sub, err = rn.nameMap(sub, id != 1); err != nil {
				return nil, nil
			}
		}
		out = appendU32(append(out, id), uint32(len(sub)))
		out = append(out, sub...)
	}
	return out, nil
}

// nameMap shifts the (outer) function indices of a name map, or of an
// indirect name map whose inner maps are copied byte for byte.
func (rn renumber) nameMap(p []byte, indirect bool) ([]byte, error) {
	r := reader{b: p}
	out, err := vec(&r, nil, func(r *reader, out []byte) ([]byte, error) {
		f, err := r.u32()
		if err != nil {
			return nil, err
		}
		out = appendU32(out, rn.fn(f))
		at := r.off
		if indirect {
			_, err = vec(r, nil, skipNaming) // read, then copied below
		} else {
			_, err = r.name()
		}
		if err != nil {
			return nil, err
		}
		return append(out, r.b[at:r.off]...), nil
	})
	if err != nil {
		return nil, err
	}
	if r.off != len(p) {
		return nil, fmt.Errorf("%w: name map", ErrMalformed)
	}
	return out, nil
}

// skipNaming reads one entry of an inner name map (an index and a name),
// appending nothing.
func skipNaming(r *reader, out []byte) ([]byte, error) {
	if _, err := r.u32(); err != nil {
		return nil, err
	}
	if _, err := r.name(); err != nil {
		return nil, err
	}
	return out, nil
}
