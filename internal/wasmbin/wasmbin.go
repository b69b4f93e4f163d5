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
	"io"
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
	if err := checkHeader(b); err != nil {
		return nil, err
	}
	var secs []Section
	for off := 8; off < len(b); {
		h, err := readHeader(b[off:min(off+maxHeader, len(b))], int64(off), int64(len(b)))
		if err != nil {
			return nil, err
		}
		secs = append(secs, Section{ID: h.ID, Payload: b[h.Payload:h.End], At: off, End: int(h.End)})
		off = int(h.End)
	}
	return secs, nil
}

// SectionAt is one section of a module read through an io.ReaderAt
// (SectionsAt): its id and the offsets of its id byte, of its payload,
// and of the byte after it.
type SectionAt struct {
	ID               byte
	At, Payload, End int64
}

// maxHeader is the most bytes a section's header takes: its id and a
// 32-bit LEB128 size.
const maxHeader = 1 + 5

// SectionsAt is Sections for the module of size bytes r reads, reading
// no more of it than its header and each section's (at most 6 bytes
// each): the same checks, without reading a payload.
func SectionsAt(r io.ReaderAt, size int64) ([]SectionAt, error) {
	var buf [8]byte
	n, err := readAt(r, buf[:], 0, size)
	if err != nil {
		return nil, err
	}
	if err := checkHeader(buf[:n]); err != nil {
		return nil, err
	}
	var secs []SectionAt
	for off := int64(8); off < size; {
		n, err := readAt(r, buf[:maxHeader], off, size)
		if err != nil {
			return nil, err
		}
		h, err := readHeader(buf[:n], off, size)
		if err != nil {
			return nil, err
		}
		secs = append(secs, h)
		off = h.End
	}
	return secs, nil
}

// CustomNameAt is CustomName for a custom section SectionsAt found in r:
// its name, and the offset of its content.
func CustomNameAt(r io.ReaderAt, s SectionAt) (name string, content int64, err error) {
	var buf [5]byte
	n, err := readAt(r, buf[:], s.Payload, s.End)
	if err != nil {
		return "", 0, err
	}
	l, k, err := u32(buf[:n])
	if err != nil {
		return "", 0, fmt.Errorf("%w: custom section name: %v", ErrMalformed, err)
	}
	if uint64(l) > uint64(s.End-s.Payload-int64(k)) {
		return "", 0, fmt.Errorf("%w: custom section name overruns its section", ErrMalformed)
	}
	p := make([]byte, l)
	if _, err := readAt(r, p, s.Payload+int64(k), s.End); err != nil { // (an empty name at the end reads nothing)
		return "", 0, err
	}
	if !utf8.Valid(p) {
		return "", 0, fmt.Errorf("%w: custom section name not UTF-8", ErrMalformed)
	}
	return string(p), s.Payload + int64(k) + int64(l), nil
}

// readAt reads into p what r holds of [off, end), as much of p as that
// holds; a shorter read is an error.
func readAt(r io.ReaderAt, p []byte, off, end int64) (int, error) {
	p = p[:min(int64(len(p)), max(end-off, 0))]
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return n, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// checkHeader checks the magic number and version at the start of b.
func checkHeader(b []byte) error {
	if len(b) < 8 || !bytes.Equal(b[:4], header[:4]) {
		return fmt.Errorf("%w: bad magic number", ErrMalformed)
	}
	if !bytes.Equal(b[4:8], header[4:]) {
		return fmt.Errorf("%w %x", ErrVersion, b[4:8])
	}
	return nil
}

// readHeader reads the header of the section at offset at of a module of
// size bytes from p, the module's bytes from at on (at least maxHeader of
// them, or all there are).
func readHeader(p []byte, at, size int64) (SectionAt, error) {
	id := p[0]
	n, k, err := u32(p[1:])
	if err != nil {
		return SectionAt{}, fmt.Errorf("%w: section %d at byte %d: size: %v", ErrMalformed, id, at, err)
	}
	payload := at + 1 + int64(k)
	if int64(n) > size-payload {
		return SectionAt{}, fmt.Errorf("%w: section %d overruns the module", ErrMalformed, id)
	}
	return SectionAt{ID: id, At: at, Payload: payload, End: payload + int64(n)}, nil
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
