package pdk

import (
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

func toABIError(err error) *abi.Error {
	var e *Error
	if errors.As(err, &e) {
		return &abi.Error{Kind: e.Kind, Message: e.Err.Error()}
	}
	return &abi.Error{Kind: abi.ErrorPermanent, Message: err.Error()}
}
