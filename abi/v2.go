package abi

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// ABI v2: the fast data path. See v2.md for the byte-level reference and
// the rationale; this file is its Go implementation (both sides: the host
// and package pdk use it).

// MinVersion is the oldest ABI version this host still runs. A module
// declares its version in its manifest's abi_version; the host speaks v1
// (JSON through Extism memory) or v2 (binary, bulk copies) to it
// accordingly.
const MinVersion = 1

// HostNamespaceV2 is the import module of the v2 host functions.
const HostNamespaceV2 = "protean:host/v2"

// Host functions of ABI v2 (module HostNamespaceV2). Pointers and lengths
// are i32 offsets into the module's own linear memory; see v2.md.
const (
	// V2InputLength () -> i32: the length of the protean_handle input.
	V2InputLength = "input_length"
	// V2InputRead (ptr i32): copies the whole input to ptr.
	V2InputRead = "input_read"
	// V2Output (ptr i32, len i32) -> i32: sets the protean_handle output;
	// 0 if taken, 1 if over the output limit (the call then fails).
	V2Output = "output"
	// V2Error (ptr i32, len i32): sets a failure message for a non-zero
	// return.
	V2Error = "error"
	// V2Load (req_ptr, req_len, buf_ptr, buf_cap i32) -> i32: a load;
	// returns the response length, the response written to buf if it fits.
	V2Load = "load"
	// V2ReadStream (req_ptr, req_len, buf_ptr, buf_cap i32) -> i32: a
	// stream read, answered like V2Load.
	V2ReadStream = "read_stream"
	// V2Response (buf_ptr, buf_cap i32) -> i32: copies the last load or
	// read_stream response (one that did not fit) to buf if it fits now;
	// returns its length.
	V2Response = "response"
	// V2Log (level i32, ptr i32, len i32): a log line; level 0 debug,
	// 1 info, 2 warn, 3 error.
	V2Log = "log"
	// V2MemoryLimit () -> i64: the memory, in bytes, a guest should keep
	// its heap under: the smaller of its cap ([plugins.limits] memory_mb)
	// and the mark above which the host replaces an instance after its
	// call (recycle_above_mb); 0 outside protean_handle. A
	// garbage-collected guest sizes its heap by it (package pdk does), so
	// it collects before its instance is thrown away.
	V2MemoryLimit = "memory_limit"
)

// MaxLogBytes bounds a v2 log line or error message; longer ones are cut.
const MaxLogBytes = 64 << 10

// ErrDecodeV2 marks bytes that are not a well-formed v2 encoding.
var ErrDecodeV2 = errors.New("malformed v2 encoding")

// v2 codes of the enumerations.
const (
	resultNone    = 0
	resultEffects = 1
	resultError   = 2
)

var recordKindCodes = []RecordKind{1: RecordAggregate, 2: RecordProjection, 3: RecordProcess}
var errorKindCodes = []ErrorKind{1: ErrorTransient, 2: ErrorRejected, 3: ErrorPermanent}
var hostErrorKindCodes = []HostErrorKind{1: HostScope, 2: HostInvalid, 3: HostNotFound, 4: HostConflict, 5: HostTransient}

func code[T comparable](table []T, v T) byte {
	for i, t := range table {
		if i > 0 && t == v {
			return byte(i)
		}
	}
	return 0
}

func fromCode[T any](table []T, c byte, what string) (T, error) {
	var zero T
	if c == 0 || int(c) >= len(table) {
		return zero, fmt.Errorf("%w: %s code %d", ErrDecodeV2, what, c)
	}
	return table[c], nil
}

// Appenders. Every integer is little-endian; a str is a u32 length and
// its bytes.

func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendI64(b []byte, v int64) []byte  { return binary.LittleEndian.AppendUint64(b, uint64(v)) }
func appendStr(b []byte, s string) []byte { return append(appendU32(b, uint32(len(s))), s...) }
func appendRaw(b []byte, s []byte) []byte { return append(appendU32(b, uint32(len(s))), s...) }

// AppendEnvelopeV2 appends env's v2 encoding to b.
func AppendEnvelopeV2(b []byte, env *Envelope) []byte {
	b = appendStr(b, env.ID)
	b = appendStr(b, env.Type)
	b = appendStr(b, env.Stream)
	b = appendI64(b, env.Position)
	b = appendI64(b, env.GlobalPosition)
	b = appendI64(b, env.Time.Unix())
	b = appendU32(b, uint32(env.Time.Nanosecond()))
	b = appendRaw(b, env.Data)
	if env.Metadata == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = appendStr(b, env.Metadata.CorrelationID)
	b = appendStr(b, env.Metadata.CausationID)
	return appendStr(b, env.Metadata.Tenant)
}

// AppendHandleRequestV2 appends the v2 encoding of a protean_handle input.
func AppendHandleRequestV2(b []byte, r *HandleRequest) []byte {
	b = appendStr(b, r.Handler)
	b = appendU32(b, uint32(len(r.Messages)))
	for i := range r.Messages {
		b = AppendEnvelopeV2(b, &r.Messages[i])
	}
	return b
}

// AppendResultV2 appends one result's v2 encoding.
func AppendResultV2(b []byte, r *Result) []byte {
	switch {
	case r.Error != nil:
		b = append(b, resultError, code(errorKindCodes, r.Error.Kind))
		return appendStr(b, r.Error.Message)
	case r.Effects != nil:
		b = append(b, resultEffects)
		return AppendEffectsV2(b, r.Effects)
	}
	return append(b, resultNone)
}

// AppendEffectsV2 appends the v2 encoding of effects.
func AppendEffectsV2(b []byte, e *Effects) []byte {
	b = appendU32(b, uint32(len(e.Events)))
	for _, ev := range e.Events {
		b = appendStr(b, ev.Stream)
		b = appendStr(b, ev.Type)
		b = appendRaw(b, ev.Data)
		if ev.ExpectedVersion == nil {
			b = appendI64(append(b, 0), 0)
		} else {
			b = appendI64(append(b, 1), *ev.ExpectedVersion)
		}
		b = appendStr(b, ev.ID)
	}
	b = appendU32(b, uint32(len(e.Writes)))
	for _, w := range e.Writes {
		b = append(b, code(recordKindCodes, w.Kind))
		b = appendStr(b, w.Type)
		b = appendStr(b, w.ID)
		b = appendI64(b, w.ExpectedVersion)
		if isNull(w.Data) {
			b = appendU32(b, 0)
		} else {
			b = appendRaw(b, w.Data)
		}
	}
	b = appendU32(b, uint32(len(e.Commands)))
	for _, c := range e.Commands {
		b = appendStr(b, c.Type)
		b = appendRaw(b, c.Data)
	}
	return b
}

// AppendHandleResponseV2 appends the v2 encoding of a protean_handle output.
func AppendHandleResponseV2(b []byte, r *HandleResponse) []byte {
	b = appendU32(b, uint32(len(r.Results)))
	for i := range r.Results {
		b = AppendResultV2(b, &r.Results[i])
	}
	return b
}

// AppendLoadRequestV2 appends the v2 encoding of a load request.
func AppendLoadRequestV2(b []byte, r *LoadRequest) []byte {
	b = append(b, code(recordKindCodes, r.Kind))
	b = appendStr(b, r.Type)
	return appendStr(b, r.ID)
}

// AppendLoadResponseV2 appends the v2 encoding of a load response.
func AppendLoadResponseV2(b []byte, r *LoadResponse) []byte {
	if r.Error != "" {
		return appendStr(append(b, hostErrorCode(r.ErrorKind)), r.Error)
	}
	found := byte(0)
	if r.Found {
		found = 1
	}
	b = append(b, 0, found)
	b = appendI64(b, r.Version)
	return appendRaw(b, r.Data)
}

func hostErrorCode(k HostErrorKind) byte {
	if c := code(hostErrorKindCodes, k); c != 0 {
		return c
	}
	return code(hostErrorKindCodes, HostTransient)
}

// AppendReadStreamRequestV2 appends the v2 encoding of a stream read.
func AppendReadStreamRequestV2(b []byte, r *ReadStreamRequest) []byte {
	b = appendStr(b, r.Stream)
	b = appendI64(b, r.From)
	return appendU32(b, uint32(min(max(r.Limit, 0), math.MaxInt32)))
}

// AppendReadStreamResponseV2 appends the v2 encoding of a stream read's
// answer.
func AppendReadStreamResponseV2(b []byte, r *ReadStreamResponse) []byte {
	if r.Error != "" {
		return appendStr(append(b, hostErrorCode(r.ErrorKind)), r.Error)
	}
	b = appendU32(append(b, 0), uint32(len(r.Messages)))
	for i := range r.Messages {
		b = AppendEnvelopeV2(b, &r.Messages[i])
	}
	return b
}

// Reader decodes v2 encodings. Its methods record the first error and
// return zero values after it, so a decoder reads straight through and
// checks Err once. Byte slices it returns alias the input.
type Reader struct {
	b   []byte
	off int
	err error
}

// NewReader returns a Reader over b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Err is the first decoding error, or nil.
func (r *Reader) Err() error { return r.err }

// Done fails the reader unless every byte was read.
func (r *Reader) Done() error {
	if r.err == nil && r.off != len(r.b) {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrDecodeV2, len(r.b)-r.off)
	}
	return r.err
}

func (r *Reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at offset %d: short input", ErrDecodeV2, what, r.off)
	}
}

func (r *Reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail(what)
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

// U8 reads one byte.
func (r *Reader) U8(what string) byte {
	if p := r.take(1, what); p != nil {
		return p[0]
	}
	return 0
}

// U32 reads a little-endian u32.
func (r *Reader) U32(what string) uint32 {
	if p := r.take(4, what); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

// I64 reads a little-endian i64.
func (r *Reader) I64(what string) int64 {
	if p := r.take(8, what); p != nil {
		return int64(binary.LittleEndian.Uint64(p))
	}
	return 0
}

// Bytes reads a length-prefixed byte string (aliasing the input; nil when
// empty).
func (r *Reader) Bytes(what string) []byte {
	n := r.U32(what)
	p := r.take(int(n), what)
	if len(p) == 0 {
		return nil
	}
	return p
}

// Str reads a length-prefixed string.
func (r *Reader) Str(what string) string { return string(r.Bytes(what)) }

// Count reads a u32 element count and checks that count elements of at
// least minSize bytes each fit in what is left, so a hostile count cannot
// make the decoder allocate more than the input justifies.
func (r *Reader) Count(what string, minSize int) int {
	n := r.U32(what)
	if r.err != nil {
		return 0
	}
	if uint64(n)*uint64(minSize) > uint64(len(r.b)-r.off) {
		r.err = fmt.Errorf("%w: %s count %d exceeds the input", ErrDecodeV2, what, n)
		return 0
	}
	return int(n)
}

// Minimum encoded sizes, for Count.
const (
	minEnvelope = 4*3 + 8*3 + 4 + 4 + 1
	minResult   = 1
	minEvent    = 4 + 4 + 4 + 1 + 8 + 4
	minWrite    = 1 + 4 + 4 + 8 + 4
	minCommand  = 4 + 4
)

// Envelope reads one envelope.
func (r *Reader) Envelope(env *Envelope) {
	env.ID = r.Str("id")
	env.Type = r.Str("type")
	env.Stream = r.Str("stream")
	env.Position = r.I64("position")
	env.GlobalPosition = r.I64("global_position")
	sec := r.I64("time")
	nsec := r.U32("time")
	if nsec >= 1e9 && r.err == nil {
		r.err = fmt.Errorf("%w: time nanoseconds %d", ErrDecodeV2, nsec)
	}
	env.Time = time.Unix(sec, int64(nsec)).UTC()
	env.Data = r.Bytes("data")
	env.Metadata = nil
	switch r.U8("metadata") {
	case 0:
	case 1:
		env.Metadata = &Metadata{CorrelationID: r.Str("correlation_id"), CausationID: r.Str("causation_id"), Tenant: r.Str("tenant")}
	default:
		if r.err == nil {
			r.err = fmt.Errorf("%w: metadata flag", ErrDecodeV2)
		}
	}
}

// DecodeHandleRequestV2 decodes a v2 protean_handle input.
func DecodeHandleRequestV2(b []byte) (*HandleRequest, error) {
	r := NewReader(b)
	req := &HandleRequest{Handler: r.Str("handler")}
	n := r.Count("messages", minEnvelope)
	if n > 0 {
		req.Messages = make([]Envelope, n)
		for i := range req.Messages {
			r.Envelope(&req.Messages[i])
		}
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	return req, nil
}

func (r *Reader) effects() *Effects {
	e := &Effects{}
	if n := r.Count("events", minEvent); n > 0 {
		e.Events = make([]NewEvent, n)
		for i := range e.Events {
			ev := &e.Events[i]
			ev.Stream = r.Str("stream")
			ev.Type = r.Str("type")
			ev.Data = r.Bytes("data")
			has := r.U8("has_expected")
			v := r.I64("expected_version")
			switch has {
			case 0:
			case 1:
				ev.ExpectedVersion = &v
			default:
				r.bad("has_expected flag")
			}
			ev.ID = r.Str("id")
		}
	}
	if n := r.Count("writes", minWrite); n > 0 {
		e.Writes = make([]Write, n)
		for i := range e.Writes {
			w := &e.Writes[i]
			k, err := fromCode(recordKindCodes, r.U8("kind"), "record kind")
			r.setErr(err)
			w.Kind = k
			w.Type = r.Str("type")
			w.ID = r.Str("id")
			w.ExpectedVersion = r.I64("expected_version")
			w.Data = r.Bytes("data")
		}
	}
	if n := r.Count("commands", minCommand); n > 0 {
		e.Commands = make([]NewCommand, n)
		for i := range e.Commands {
			e.Commands[i].Type = r.Str("type")
			e.Commands[i].Data = r.Bytes("data")
		}
	}
	return e
}

func (r *Reader) bad(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at offset %d", ErrDecodeV2, what, r.off)
	}
}

func (r *Reader) setErr(err error) {
	if r.err == nil && err != nil {
		r.err = err
	}
}

// DecodeResultsV2 decodes a v2 protean_handle output without checking
// its content (DecodeHandleResponseV2 does).
func DecodeResultsV2(b []byte) (*HandleResponse, error) {
	r := NewReader(b)
	resp := &HandleResponse{}
	n := r.Count("results", minResult)
	resp.Results = make([]Result, n)
	for i := range resp.Results {
		switch r.U8("result") {
		case resultNone:
		case resultEffects:
			resp.Results[i].Effects = r.effects()
		case resultError:
			k, err := fromCode(errorKindCodes, r.U8("error kind"), "error kind")
			r.setErr(err)
			resp.Results[i].Error = &Error{Kind: k, Message: r.Str("message")}
		default:
			r.bad("result tag")
		}
		if r.err != nil {
			break
		}
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	return resp, nil
}

// DecodeHandleResponseV2 parses and checks a v2 protean_handle output for a
// request of n messages, exactly as DecodeHandleResponse does a v1 one.
func DecodeHandleResponseV2(b []byte, n, limit int) (*HandleResponse, error) {
	if len(b) > limit {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrResponse, len(b), limit)
	}
	resp, err := DecodeResultsV2(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if err := checkResults(resp, n); err != nil {
		return nil, err
	}
	if err := checkV2(resp); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResponse, err)
	}
	return resp, nil
}

// checkV2 holds a v2 response to what v1's JSON decoding guarantees by
// construction: every payload is valid JSON and every string valid UTF-8.
func checkV2(resp *HandleResponse) error {
	data := func(what string, i int, b []byte) error {
		if len(b) > 0 && !json.Valid(b) {
			return fmt.Errorf("%s[%d].data is not valid JSON", what, i)
		}
		return nil
	}
	text := func(what string, i int, ss ...string) error {
		for _, s := range ss {
			if !utf8.ValidString(s) {
				return fmt.Errorf("%s[%d] has a string that is not valid UTF-8", what, i)
			}
		}
		return nil
	}
	for r, res := range resp.Results {
		var err error
		if res.Error != nil {
			err = text("results", r, res.Error.Message)
		}
		if res.Effects != nil {
			for i, ev := range res.Effects.Events {
				err = errors.Join(err, data("events", i, ev.Data), text("events", i, ev.Stream, ev.Type, ev.ID))
			}
			for i, w := range res.Effects.Writes {
				err = errors.Join(err, data("writes", i, w.Data), text("writes", i, w.Type, w.ID))
			}
			for i, c := range res.Effects.Commands {
				err = errors.Join(err, data("commands", i, c.Data), text("commands", i, c.Type))
			}
		}
		if err != nil {
			return fmt.Errorf("results[%d]: %w", r, err)
		}
	}
	return nil
}

// DecodeLoadRequestV2 parses and checks a guest's v2 load request.
func DecodeLoadRequestV2(b []byte) (*LoadRequest, error) {
	if len(b) > MaxHostRequestBytes {
		return nil, fmt.Errorf("%w: request exceeds the %d-byte limit", ErrResponse, MaxHostRequestBytes)
	}
	r := NewReader(b)
	k, err := fromCode(recordKindCodes, r.U8("kind"), "record kind")
	r.setErr(err)
	req := &LoadRequest{Kind: k, Type: r.Str("type"), ID: r.Str("id")}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	return req, nil
}

// status reads a host-function answer's status byte and, when it is not
// 0 (ok), the error message after it. An unknown code reads as an empty
// kind, which counts as transient (HostErrorKind.Retryable).
func (r *Reader) status() (HostErrorKind, string) {
	c := r.U8("status")
	if c == 0 {
		return "", ""
	}
	kind, _ := fromCode(hostErrorKindCodes, c, "host error kind")
	msg := r.Str("message")
	if msg == "" {
		msg = "host error"
	}
	return kind, msg
}

// DecodeLoadResponseV2 decodes the host's answer to a v2 load.
func DecodeLoadResponseV2(b []byte) (*LoadResponse, error) {
	r := NewReader(b)
	resp := &LoadResponse{}
	if resp.ErrorKind, resp.Error = r.status(); resp.Error == "" {
		resp.Found = r.U8("found") == 1
		resp.Version = r.I64("version")
		resp.Data = r.Bytes("data")
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	return resp, nil
}

// DecodeReadStreamRequestV2 parses and checks a guest's v2 stream read.
func DecodeReadStreamRequestV2(b []byte) (*ReadStreamRequest, error) {
	if len(b) > MaxHostRequestBytes {
		return nil, fmt.Errorf("%w: request exceeds the %d-byte limit", ErrResponse, MaxHostRequestBytes)
	}
	r := NewReader(b)
	req := &ReadStreamRequest{Stream: r.Str("stream"), From: r.I64("from"), Limit: int(r.U32("limit"))}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrResponse, err)
	}
	if err := req.check(); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeReadStreamResponseV2 decodes the host's answer to a v2 stream read.
func DecodeReadStreamResponseV2(b []byte) (*ReadStreamResponse, error) {
	r := NewReader(b)
	resp := &ReadStreamResponse{}
	if resp.ErrorKind, resp.Error = r.status(); resp.Error == "" {
		if n := r.Count("messages", minEnvelope); n > 0 {
			resp.Messages = make([]Envelope, n)
			for i := range resp.Messages {
				r.Envelope(&resp.Messages[i])
			}
		}
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	return resp, nil
}
