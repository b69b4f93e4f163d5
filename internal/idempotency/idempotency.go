package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxKeyLength bounds an Idempotency-Key, in bytes.
const MaxKeyLength = 255

// DefaultTTL is how long a key is kept when the config says nothing.
const DefaultTTL = 24 * time.Hour

var (
	// ErrMismatch: the key was used before with another request body.
	ErrMismatch = errors.New("idempotency key reused with another request body")
	// ErrInvalid: an empty or oversized key or scope.
	ErrInvalid = errors.New("invalid idempotency key")
)

// Request is one request under a key.
type Request struct {
	// Scope is the command type: one key may be used per command type.
	Scope string
	Key   string
	// Hash identifies the request body (see HashBody).
	Hash []byte
}

// Answer is what a request's client got: an HTTP status and a JSON body.
type Answer struct {
	Status int
	Body   json.RawMessage
}

// HashBody returns the SHA-256 of body's compacted JSON (whitespace does
// not make another request), or of body itself when it is not JSON.
func HashBody(body []byte) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, body) == nil {
		body = buf.Bytes()
	}
	h := sha256.Sum256(body)
	return h[:]
}

// Store keeps answers by key.
type Store interface {
	// Begin waits until no other request of r's key is in progress, then
	// returns the key's stored answer (ErrMismatch if it was stored for
	// another body), or nil: then the caller runs the request, Saves its
	// answer, and calls done. done must be called whenever err is nil;
	// answered says that the request's answer is stored (Save succeeded,
	// or its unit of work stored the final answer), so that done has
	// nothing to release: false lets the next request of the key run it.
	Begin(ctx context.Context, r Request) (stored *Answer, done func(answered bool), err error)
	// Save stores r's answer, kept for the store's TTL, replacing one
	// stored in the request's unit of work.
	Save(ctx context.Context, r Request, a Answer) error
}

func validRequest(r Request) error {
	switch {
	case r.Key == "" || len(r.Key) > MaxKeyLength:
		return fmt.Errorf("%w: want 1 to %d bytes, got %d", ErrInvalid, MaxKeyLength, len(r.Key))
	case strings.ContainsFunc(r.Key, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		return fmt.Errorf("%w: control characters", ErrInvalid)
	case r.Scope == "":
		return fmt.Errorf("%w: empty scope", ErrInvalid)
	case len(r.Hash) == 0:
		return fmt.Errorf("%w: empty request hash", ErrInvalid)
	}
	return nil
}

// check returns the stored answer for r, or ErrMismatch.
func check(r Request, hash []byte, a Answer) (*Answer, error) {
	if !bytes.Equal(hash, r.Hash) {
		return nil, fmt.Errorf("key %q of %s: %w", r.Key, r.Scope, ErrMismatch)
	}
	return &a, nil
}
