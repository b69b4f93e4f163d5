package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/partition"
)

// Sentinel conditions of a command or query.
var (
	// ErrUnknownCommand: no module handles the command type.
	ErrUnknownCommand = errors.New("unknown command type")
	// ErrUnknownProjection: no projector or process manager has the name.
	ErrUnknownProjection = errors.New("unknown projection")
	// ErrNotFound: the projection has no document with the id.
	ErrNotFound = errors.New("not found")
	// ErrBadInput: the command's body is not a JSON object.
	ErrBadInput = errors.New("bad input")
	// ErrStopped: the engine is stopping or stopped.
	ErrStopped = errors.New("engine stopped")
)

// HandlerError is a handler's failure to handle a message: the error it
// returned (Kind says whether a retry can help), or a failed call.
type HandlerError struct {
	File    string
	Handler string
	Type    string
	Kind    abi.ErrorKind
	Err     error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("plugin %s: handler %s: %s: %v", e.File, e.Handler, e.Type, e.Err)
}

// Unwrap returns the cause.
func (e *HandlerError) Unwrap() error { return e.Err }

// Retryable reports whether a retry of the message may succeed.
func (e *HandlerError) Retryable() bool { return e.Kind.Retryable() }

// Rejected reports whether the handler rejected the message on domain
// grounds (a command answers 422).
func (e *HandlerError) Rejected() bool { return e.Kind == abi.ErrorRejected }

// ScopeError is an effect or a host-function request outside what the
// module may touch: a record of another module's handler, an event type it
// did not declare, a stream of a category it does not know.
type ScopeError struct {
	File string
	// Tenant is the module's tenant.
	Tenant string
	// What says what was refused. It never names another tenant: the
	// guest and the client read it.
	What string
	// Owner is the other tenant whose data or command the request
	// reached for ("" for none): for the operator's log and metrics only.
	Owner string
}

func (e *ScopeError) Error() string {
	return fmt.Sprintf("plugin %s (tenant %s): %s", e.File, e.Tenant, e.What)
}

// result is one guest result with the error the engine reads from it: nil,
// or a *HandlerError. The error keeps the host's own cause where the host
// has one (a *ScopeError of an effect, or of a host-function request the
// module then failed on), so callers can errors.As it end to end.
type result struct {
	abi.Result
	err error
}

// checkResults reads a batch's results up to the first failure: a result
// the module failed, or one whose effects leave the module's scope (that
// one becomes a permanent failure). refused is the last scope violation the
// session answered during the call, if any.
func checkResults(route host.Route, envs []abi.Envelope, results []abi.Result, sc *scope, refused error) []result {
	out := make([]result, len(results))
	for i, r := range results {
		out[i].Result = r
		herr := func(kind abi.ErrorKind, err error) *HandlerError {
			return &HandlerError{File: route.Module.File, Handler: route.Handler.Name, Type: envs[i].Type, Kind: kind, Err: err}
		}
		if r.Error != nil {
			err := error(&guestError{msg: r.Error.Message})
			kind := r.Error.Kind
			// The guest's message carries the refusal's text when the
			// module failed because the host refused it: keep the
			// host's *ScopeError as the cause, and never retry it (a
			// module built before host errors had kinds calls it
			// transient; the same request is refused every time).
			if refused != nil && strings.Contains(r.Error.Message, refused.Error()) {
				err = &guestError{msg: r.Error.Message, cause: refused}
				kind = abi.ErrorPermanent
			}
			out[i].err = herr(kind, err)
			break
		}
		err := sc.effects(r.Effects)
		if err == nil && route.Handler.DocumentsByKey {
			err = documentsByKey(route.Handler, envs[i], r.Effects)
		}
		if err != nil {
			out[i].Result = abi.Result{Error: &abi.Error{Kind: abi.ErrorPermanent, Message: err.Error()}}
			out[i].err = herr(abi.ErrorPermanent, err)
			break
		}
	}
	return out
}

// documentsByKey checks that a projector declared documents_by_key wrote
// only the document its message's key names: a read of that document as
// of a position waits for that key's partition alone, so a write of
// another document would be read before it was made.
func documentsByKey(h abi.Handler, env abi.Envelope, e *abi.Effects) error {
	if e == nil {
		return nil
	}
	key, ok := partition.FieldKey(env.Data, h.SequentialBy.Field)
	for _, w := range e.Writes {
		if w.Kind != abi.RecordProjection || w.Type != h.Name {
			continue
		}
		if !ok || w.ID != key {
			return fmt.Errorf("%w: projector %s declares documents_by_key, so an event whose %s is %q writes only that document, but it wrote document %q",
				ErrDocumentKey, h.Name, h.SequentialBy.Field, key, abi.Clip(w.ID, abi.ClipLength))
		}
	}
	return nil
}

// ErrDocumentKey: a projector declared documents_by_key and wrote another
// document than its event's key names.
var ErrDocumentKey = errors.New("write outside the event's document")

// guestError is the error a module returned for a message: its message,
// and the host's error behind it when the host knows it.
type guestError struct {
	msg   string
	cause error
}

// maxGuestMessage bounds how much of a guest's error message the host
// repeats (in answers and logs): a module quoting a client's huge value
// must not make every line that mentions the failure huge too.
const maxGuestMessage = 1024

func (e *guestError) Error() string { return abi.Clip(e.msg, maxGuestMessage) }

// Unwrap returns the host's cause, or nil.
func (e *guestError) Unwrap() error { return e.cause }
