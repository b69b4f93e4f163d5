package record

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/proteanhq/protean-host/internal/jsonnul"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Record kinds.
const (
	KindAggregate  = "aggregate"
	KindProjection = "projection"
	KindProcess    = "process"
)

// Key names a record. Kind is one of the Kind constants by convention; Type
// is the aggregate category, projection name or process manager name; ID is
// the record's identity within them.
type Key struct {
	Kind string
	Type string
	ID   string
}

func (k Key) String() string { return k.Kind + "/" + k.Type + "/" + k.ID }

// Record is a stored record.
type Record struct {
	Key Key
	// Version is the number of writes the record has had; 0 means it was
	// never written.
	Version int64
	// Data is the record's JSON document; nil when the record was never
	// written or was deleted.
	Data json.RawMessage
}

// Exists reports whether the record holds data.
func (r Record) Exists() bool { return r.Data != nil }

// Write changes one record, guarded by its version.
type Write struct {
	Key Key
	// ExpectedVersion is the record's version now: 0 for a record never
	// written. The write gives it ExpectedVersion+1.
	ExpectedVersion int64
	// Data is the new JSON document; nil or null deletes the data.
	Data json.RawMessage
}

// Store loads and writes records.
type Store interface {
	// Load returns the record under key; a record never written has
	// Version 0 and nil Data, and is not an error.
	Load(ctx context.Context, key Key) (Record, error)
	// Commit applies writes all or nothing.
	Commit(ctx context.Context, writes []Write) error
}

// Errors for conditions.
var (
	// ErrExpectedVersion is wrapped by every *VersionError.
	ErrExpectedVersion = errors.New("wrong expected version")
	// ErrInvalid is wrapped by errors about malformed input: an empty key
	// part, a negative expected version, invalid JSON.
	ErrInvalid = errors.New("invalid record input")
	// ErrTxDone means a transaction was used after Commit or Rollback. It
	// is the one sentinel every store shares (errors.Is holds across them).
	ErrTxDone = txdone.Err
)

// VersionError reports a record that was not at the version a write
// expected. It unwraps to ErrExpectedVersion.
type VersionError struct {
	Key      Key
	Expected int64
	Actual   int64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("record %s: expected version %d, actual %d", e.Key, e.Expected, e.Actual)
}

// Unwrap returns ErrExpectedVersion.
func (e *VersionError) Unwrap() error { return ErrExpectedVersion }

func validKey(k Key) error {
	if k.Kind == "" || k.Type == "" || k.ID == "" {
		return fmt.Errorf("%w: key %q: kind, type and id must not be empty", ErrInvalid, k.String())
	}
	for _, part := range []string{k.Kind, k.Type, k.ID} {
		if why := jsonnul.RefusedText(part); why != "" {
			return fmt.Errorf("%w: key %q: %s", ErrInvalid, k.String(), why)
		}
	}
	return nil
}

// prepare validates writes and returns copies with their Data copied, and
// nil for a delete. Store implementations share it so that they reject the
// same input.
func prepare(writes []Write) ([]Write, error) {
	out := make([]Write, len(writes))
	for i, w := range writes {
		if err := validKey(w.Key); err != nil {
			return nil, fmt.Errorf("write %d: %w", i, err)
		}
		if w.ExpectedVersion < 0 {
			return nil, fmt.Errorf("write %d: record %s: %w: expected version %d", i, w.Key, ErrInvalid, w.ExpectedVersion)
		}
		if w.Data != nil {
			if !json.Valid(w.Data) {
				return nil, fmt.Errorf("write %d: record %s: %w: data is not JSON", i, w.Key, ErrInvalid)
			}
			if why := jsonnul.Refused(w.Data); why != "" {
				return nil, fmt.Errorf("write %d: record %s: %w: data: %s", i, w.Key, ErrInvalid, why)
			}
			if bytes.Equal(bytes.TrimSpace(w.Data), []byte("null")) {
				w.Data = nil
			}
		}
		w.Data = slices.Clone(w.Data)
		out[i] = w
	}
	return out, nil
}
