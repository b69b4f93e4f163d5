package host

import (
	"context"
	"encoding/json"

	extism "github.com/extism/go-sdk"

	"github.com/proteanhq/protean-host/abi"
)

// Session answers a guest's host-function calls during one protean_handle
// call: it is where loads and stream reads go, scoped to what the calling
// module may see.
type Session interface {
	Load(ctx context.Context, req *abi.LoadRequest) abi.LoadResponse
	// ReadStream answers one page of a stream: at most req.Limit events
	// (the session caps it too) and at most maxBytes of their data and
	// metadata, the first event however large (eventstore's
	// ReadStreamBytes); maxBytes <= 0 bounds nothing.
	ReadStream(ctx context.Context, req *abi.ReadStreamRequest, maxBytes int) abi.ReadStreamResponse
}

// InvalidObserver is an optional ability of a Session: it is told of each
// request the host answered as malformed before the Session saw it (an id
// over abi.MaxIDLength, say), so that a message the module then fails can
// keep the host's error as its cause.
type InvalidObserver interface {
	Invalid(err error)
}

func invalid(s Session, err error) {
	if o, ok := s.(InvalidObserver); ok {
		o.Invalid(err)
	}
}

type sessionKey struct{}

// withSession returns a context carrying s for the host functions of calls
// made with it.
func withSession(ctx context.Context, s Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

func sessionFrom(ctx context.Context) Session {
	s, _ := ctx.Value(sessionKey{}).(Session)
	return s
}

// HostFunctions returns the ABI's host functions. They find the Session of
// the call through its context; outside a handle call they answer with an
// error. If fallback is non-nil it serves calls whose context has none.
// A request the host cannot read (bad offset, over the limit, malformed,
// no session) is answered with abi.HostInvalid; the Session sets the kind
// of every other error it answers.
func HostFunctions(fallback Session) []extism.HostFunction {
	load := extism.NewHostFunctionWithStack(abi.HostLoad,
		func(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
			stack[0] = answer(ctx, p, abi.HostLoad, stack[0], func(s Session, b []byte) any {
				req, err := abi.DecodeLoadRequest(b)
				if err != nil {
					invalid(s, err)
					return abi.LoadResponse{Error: err.Error(), ErrorKind: abi.HostInvalid}
				}
				return s.Load(ctx, req)
			}, func(msg string) any { return abi.LoadResponse{Error: msg, ErrorKind: abi.HostInvalid} }, fallback)
		}, []extism.ValueType{extism.ValueTypePTR}, []extism.ValueType{extism.ValueTypePTR})
	load.SetNamespace(abi.HostNamespace)
	read := extism.NewHostFunctionWithStack(abi.HostReadStream,
		func(ctx context.Context, p *extism.CurrentPlugin, stack []uint64) {
			stack[0] = answer(ctx, p, abi.HostReadStream, stack[0], func(s Session, b []byte) any {
				req, err := abi.DecodeReadStreamRequest(b)
				if err != nil {
					invalid(s, err)
					return abi.ReadStreamResponse{Error: err.Error(), ErrorKind: abi.HostInvalid}
				}
				return s.ReadStream(ctx, req, budgetFrom(ctx).readBytes())
			}, func(msg string) any { return abi.ReadStreamResponse{Error: msg, ErrorKind: abi.HostInvalid} }, fallback)
		}, []extism.ValueType{extism.ValueTypePTR}, []extism.ValueType{extism.ValueTypePTR})
	read.SetNamespace(abi.HostNamespace)
	return []extism.HostFunction{load, read}
}

// answer reads a guest's JSON request at offset, bounded by
// abi.MaxHostRequestBytes, and writes back the JSON of the response. A bad
// offset or oversized request gets an error response; the call's budget
// (budget.go) ends the call past its host calls or bytes.
func answer(ctx context.Context, p *extism.CurrentPlugin, fn string, offset uint64,
	serve func(Session, []byte) any, errResp func(string) any, fallback Session) uint64 {
	s := sessionFrom(ctx)
	if s == nil {
		s = fallback
	}
	b := budgetFrom(ctx)
	var late error
	if s != nil {
		late = b.enter(ctx, fn)
	}
	var resp any
	switch n, err := p.Length(offset); {
	case late != nil:
		resp = errResp(late.Error())
	case err != nil:
		resp = errResp("bad request offset: " + err.Error())
	case n > abi.MaxHostRequestBytes:
		resp = errResp("request exceeds the host-function request limit")
	case s == nil:
		resp = errResp("host functions are available only while a message is handled")
	default:
		b, err := p.ReadBytes(offset)
		if err != nil {
			resp = errResp("bad request: " + err.Error())
			break
		}
		resp = serve(s, b)
	}
	out, err := json.Marshal(resp)
	if err != nil {
		out, _ = json.Marshal(errResp("encode response: " + err.Error()))
	}
	b.answer(fn, len(out), false)
	off, err := p.WriteBytes(out)
	if err != nil {
		return 0
	}
	return off
}
