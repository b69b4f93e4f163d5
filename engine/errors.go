package engine

import (
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/abi"
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
	What string
}

func (e *ScopeError) Error() string { return fmt.Sprintf("plugin %s: %s", e.File, e.What) }
