package pdk

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/abi"
)

// Error is a handler failure of a stated kind. Return one from a handler to
// tell the host whether a retry can help; any other error is permanent.
type Error struct {
	Kind abi.ErrorKind
	Err  error
}

func (e *Error) Error() string { return string(e.Kind) + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Rejected fails the message because the domain says no (a command answers
// 422). A retry will not help.
func Rejected(format string, args ...any) error {
	return &Error{Kind: abi.ErrorRejected, Err: fmt.Errorf(format, args...)}
}

// Transient fails the message for a reason a retry may cure.
func Transient(err error) error { return &Error{Kind: abi.ErrorTransient, Err: err} }

// Permanent fails the message for a reason a retry will not cure.
func Permanent(err error) error { return &Error{Kind: abi.ErrorPermanent, Err: err} }

// HostError is a host function's refusal or failure, as the host
// classified it. Load and ReadStream return it wrapped in an *Error whose
// Kind follows Kind (abi.HostErrorKind.HandlerKind): a request outside the
// module's scope, malformed or naming nothing fails the message
// permanently, since asking again gets the same answer; a conflict or a
// store failure fails it transiently. A handler that wants to decide for
// itself finds it with errors.As.
type HostError struct {
	// Function is the host function: abi.HostLoad or abi.HostReadStream.
	Function string
	// Kind is the host's classification; an older host sends none, which
	// counts as transient.
	Kind abi.HostErrorKind
	// Op names the request, e.g. "load aggregate order/o-1".
	Op      string
	Message string
}

func (e *HostError) Error() string { return e.Op + ": " + e.Message }

// hostError is the error a handler gets for a host function's error
// response.
func hostError(function, op, msg string, kind abi.HostErrorKind) error {
	he := &HostError{Function: function, Kind: kind, Op: op, Message: msg}
	return &Error{Kind: kind.HandlerKind(), Err: he}
}

func toABIError(err error) *abi.Error {
	var e *Error
	if errors.As(err, &e) {
		return &abi.Error{Kind: e.Kind, Message: e.Err.Error()}
	}
	return &abi.Error{Kind: abi.ErrorPermanent, Message: err.Error()}
}

// decodeError is the failure of a message that does not decode into its Go
// type. A command's payload is the client's: a payload the handler cannot
// read is rejected (the host answers 422), naming the field. An event's
// payload was written by a module: not reading it is a permanent failure
// (a bug or an incompatible change), which halts its partition.
func decodeError(typ string, command bool, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		err = fmt.Errorf("%s: want %s, got JSON %s", te.Field, te.Type, te.Value)
	}
	err = fmt.Errorf("decode %s: %w", typ, err)
	if command {
		return &Error{Kind: abi.ErrorRejected, Err: err}
	}
	return Permanent(err)
}
