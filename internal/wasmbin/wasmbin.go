// Package wasmbin splits a binary WebAssembly module into its sections:
// the one walk shared by package instrument, which rewrites modules, and
// package abi, which reads and writes the protean.manifest custom section.
// It checks the framing only (magic number, version, each section's size);
// what a section holds is its reader's to check.
package wasmbin

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Errors Sections returns.
var (
	// ErrMalformed is bytes that do not frame a module.
	ErrMalformed = errors.New("malformed module")
	// ErrVersion is a module of a binary version other than 1.
	ErrVersion = errors.New("unsupported binary version")
)

// CustomID is the id of a custom section.
const CustomID = 0

// header is the magic number and binary version 1 every module starts with.
var header = []byte{0, 'a', 's', 'm', 1, 0, 0, 0}

// Section is one section of a module.
type Section struct {
	ID      byte
	Payload []byte
	// At and End are the offsets of its id byte and of the byte after it.
	At, End int
}

// Sections splits the module b into its sections, in order. The payloads
// alias b.
func Sections(b []byte) ([]Section, error) {
	if len(b) < 8 || !bytes.Equal(b[:4], header[:4]) {
		return nil, fmt.Errorf("%w: bad magic number", ErrMalformed)
	}
	if !bytes.Equal(b[4:8], header[4:]) {
		return nil, fmt.Errorf("%w %x", ErrVersion, b[4:8])
	}
	var secs []Section
	for off := 8; off < len(b); {
		at := off
		id := b[off]
		size, n, err := u32(b[off+1:])
		if err != nil {
			return nil, fmt.Errorf("%w: section %d at byte %d: size: %v", ErrMalformed, id, at, err)
		}
		off += 1 + n
		if uint64(size) > uint64(len(b)-off) {
			return nil, fmt.Errorf("%w: section %d overruns the module", ErrMalformed, id)
		}
		off += int(size)
		secs = append(secs, Section{ID: id, Payload: b[at+1+n : off], At: at, End: off})
	}
	return secs, nil
}

// CustomName splits a custom section's payload into its name (valid
// UTF-8) and its content.
func CustomName(p []byte) (name string, content []byte, err error) {
	n, k, err := u32(p)
	if err != nil {
		return "", nil, fmt.Errorf("%w: custom section name: %v", ErrMalformed, err)
	}
	if uint64(n) > uint64(len(p)-k) {
		return "", nil, fmt.Errorf("%w: custom section name overruns its section", ErrMalformed)
	}
	if !utf8.Valid(p[k : k+int(n)]) {
		return "", nil, fmt.Errorf("%w: custom section name not UTF-8", ErrMalformed)
	}
	return string(p[k : k+int(n)]), p[k+int(n):], nil
}

// AppendCustom appends to b a custom section named name holding content.
func AppendCustom(b []byte, name string, content []byte) []byte {
	p := AppendU32(nil, uint32(len(name)))
	b = append(b, CustomID)
	b = AppendU32(b, uint32(len(p)+len(name)+len(content)))
	b = append(b, p...)
	b = append(b, name...)
	return append(b, content...)
}

// AppendU32 appends v as an unsigned LEB128.
func AppendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// u32 reads an unsigned LEB128 of at most 32 bits from the start of p and
// returns it and its length.
func u32(p []byte) (v uint32, n int, err error) {
	for shift := 0; ; shift += 7 {
		if shift >= 35 {
			return 0, 0, errors.New("integer too long")
		}
		if n >= len(p) {
			return 0, 0, errors.New("unexpected end")
		}
		c := p[n]
		n++
		v |= uint32(c&0x7F) << shift
		if c&0x80 == 0 {
			if shift == 28 && c>>4 != 0 {
				return 0, 0, errors.New("integer too large")
			}
			return v, n, nil
		}
	}
}
