package instrument

import (
	"fmt"
	"unicode/utf8"
)

// reader decodes the binary format's primitives, every failure an
// ErrMalformed.
type reader struct {
	b   []byte
	off int
}

func (r *reader) malformed(what string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformed, what, r.off)
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.malformed("unexpected end")
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) bytes(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, r.malformed("unexpected end")
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

// uleb reads an unsigned LEB128 of at most bits bits.
func (r *reader) uleb(bits int) (uint64, error) {
	var v uint64
	for shift := 0; ; shift += 7 {
		if shift >= bits {
			return 0, r.malformed("integer too long")
		}
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7F) << shift
		if c&0x80 == 0 {
			if bits < 64 && v>>bits != 0 {
				return 0, r.malformed("integer too large")
			}
			return v, nil
		}
	}
}

func (r *reader) u32() (uint32, error) {
	v, err := r.uleb(32)
	return uint32(v), err
}

// sleb skips a signed LEB128 of at most bits bits.
func (r *reader) sleb(bits int) (int64, error) {
	var v int64
	shift := 0
	for i := 0; ; i++ {
		if i == (bits+6)/7 {
			return 0, r.malformed("integer too long")
		}
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= int64(c&0x7F) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v, nil
		}
	}
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	p, err := r.bytes(int(n))
	if err != nil {
		return "", err
	}
	if !utf8.Valid(p) {
		return "", r.malformed("name not UTF-8")
	}
	return string(p), nil
}

func (r *reader) limits() error {
	flags, err := r.byte()
	if err != nil {
		return err
	}
	if flags > 0x07 {
		return r.malformed(fmt.Sprintf("limits flags %#x", flags))
	}
	if _, err := r.uleb(64); err != nil {
		return err
	}
	if flags&1 != 0 {
		_, err = r.uleb(64)
	}
	return err
}

// valtype reads a number, vector or reference type; GC reference types
// are refused.
func (r *reader) valtype() error {
	t, err := r.byte()
	if err != nil {
		return err
	}
	switch t {
	case 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F:
		return nil
	}
	return fmt.Errorf("%w: value type %#x", ErrUnsupported, t)
}

// blocktype reads an empty type (0x40), a value type, or a type index
// (all three are one s33).
func (r *reader) blocktype() error {
	at := r.off
	v, err := r.sleb(33)
	if err != nil {
		return err
	}
	switch {
	case v >= 0, v == -0x40: // type index, empty
		return nil
	case r.off-at != 1:
		return r.malformed("block type")
	}
	r.off = at
	return r.valtype()
}

func (r *reader) memarg() error {
	align, err := r.u32()
	if err != nil {
		return err
	}
	if align&0x40 != 0 { // multi-memory: a memory index follows
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	_, err = r.uleb(64)
	return err
}

func appendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendName(b []byte, s string) []byte {
	return append(appendU32(b, uint32(len(s))), s...)
}

func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
