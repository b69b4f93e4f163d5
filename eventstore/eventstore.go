package eventstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/jsonnul"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Expected versions with a special meaning.
const (
	// AnyVersion skips the stream-version check.
	AnyVersion int64 = -2
	// NoStream expects the stream to have no events yet.
	NoStream int64 = -1
)

// DefaultLimit is the number of events a read returns when its limit is not
// positive. It matches MessageDB's default batch size.
const DefaultLimit = 1000

// Event is a stored event.
type Event struct {
	// ID is the event's UUID, in canonical lower-case form.
	ID     string
	Stream string
	Type   string
	// Position is the event's 0-based position in its stream.
	Position int64
	// GlobalPosition is the event's 1-based position in the store.
	GlobalPosition int64
	// Time is when the event was recorded, in UTC, to the microsecond.
	Time     time.Time
	Data     json.RawMessage
	Metadata json.RawMessage
}

// NewEvent is an event to append.
type NewEvent struct {
	// ID is the event's UUID; empty lets the store assign a random one.
	ID     string
	Stream string
	Type   string
	// Data and Metadata are JSON values, or nil.
	Data     json.RawMessage
	Metadata json.RawMessage
	// ExpectedVersion is the version the stream must have just before this
	// event: the position of its last event, NoStream, or AnyVersion for no
	// check. The zero value expects position 0, so set it explicitly.
	ExpectedVersion int64
}

// Appender appends events atomically. Both a Store and a transaction on one
// satisfy it.
type Appender interface {
	// Append stores events all or nothing and returns them as stored, in the
	// order given.
	Append(ctx context.Context, events []NewEvent) ([]Event, error)
}

// Store is an event store.
type Store interface {
	Appender
	// ReadStream returns up to limit events of stream with position >=
	// fromPosition, ascending.
	ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]Event, error)
	// ReadStreamBytes is ReadStream bounded by size as well: it stops
	// before the event that would take the data and metadata of the
	// events it returns past maxBytes (their lengths as the store returns
	// them), but returns the first event however large, so that a reader
	// paging through a stream always moves on (events are bounded where
	// they are written: a handler's output limit). maxBytes <= 0 bounds
	// nothing. The store bounds the read itself: it never holds the events
	// it does not return.
	ReadStreamBytes(ctx context.Context, stream string, fromPosition int64, limit, maxBytes int) ([]Event, error)
	// ReadCategory returns up to limit events of category with global
	// position >= fromGlobal, ascending.
	ReadCategory(ctx context.Context, category string, fromGlobal int64, limit int) ([]Event, error)
	// ReadAll returns up to limit events with global position >= fromGlobal,
	// ascending.
	ReadAll(ctx context.Context, fromGlobal int64, limit int) ([]Event, error)
	// StreamVersion returns the position of the stream's last event, or
	// NoStream.
	StreamVersion(ctx context.Context, stream string) (int64, error)
}

// BackwardReader is an optional ability of a Store (Memory and Postgres
// have it; it is not part of Store, so that other implementations need
// not): reading a category newest first, for a reader that looks for the
// last event of some kind at or below a position and stops at the first
// it finds (package readyourwrites' search for a key's last event).
type BackwardReader interface {
	// ReadCategoryBackward returns up to limit events of category with
	// afterGlobal < global position <= toGlobal, descending (newest
	// first); limit <= 0 is DefaultLimit. The lower bound keeps the read
	// within the range whatever the category's density. Only each event's GlobalPosition and Data are
	// promised: Memory and Postgres leave the other fields empty (the
	// reader needs no more, and the database sends no more).
	ReadCategoryBackward(ctx context.Context, category string, afterGlobal, toGlobal int64, limit int) ([]Event, error)
}

// Errors for conditions.
var (
	// ErrExpectedVersion is wrapped by every *VersionError.
	ErrExpectedVersion = errors.New("wrong expected version")
	// ErrDuplicateID means an event with that ID is already stored, or
	// appears twice in one batch.
	ErrDuplicateID = errors.New("duplicate event id")
	// ErrInvalid is wrapped by errors about malformed input: a bad stream or
	// category name, an empty type, a bad ID, invalid JSON.
	ErrInvalid = errors.New("invalid event store input")
	// ErrTxDone means a transaction was used after Commit or Rollback. It
	// is the one sentinel every store shares (errors.Is holds across them).
	ErrTxDone = txdone.Err
)

// VersionError reports a stream that was not at the version an append
// expected. It unwraps to ErrExpectedVersion.
type VersionError struct {
	Stream   string
	Expected int64
	Actual   int64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("eventstore: stream %s: expected version %d, actual %d", e.Stream, e.Expected, e.Actual)
}

// Unwrap returns ErrExpectedVersion.
func (e *VersionError) Unwrap() error { return ErrExpectedVersion }

// Category returns the category of a stream name: the part before the first
// '-', or the whole name when it has none.
func Category(stream string) string {
	if i := strings.IndexByte(stream, '-'); i >= 0 {
		return stream[:i]
	}
	return stream
}

// validStream reports why stream is not a valid stream name, or nil. A
// stream name is "{category}-{id}" with both parts non-empty.
func validStream(stream string) error {
	i := strings.IndexByte(stream, '-')
	if i <= 0 || i == len(stream)-1 {
		return fmt.Errorf("%w: stream %q: want {category}-{id}", ErrInvalid, stream)
	}
	if why := jsonnul.RefusedText(stream); why != "" {
		return fmt.Errorf("%w: stream %q: %s", ErrInvalid, stream, why)
	}
	return nil
}

// validCategory reports why category is not a valid category name, or nil.
func validCategory(category string) error {
	if category == "" || strings.IndexByte(category, '-') >= 0 {
		return fmt.Errorf("%w: category %q: want a non-empty name without '-'", ErrInvalid, category)
	}
	if why := jsonnul.RefusedText(category); why != "" {
		return fmt.Errorf("%w: category %q: %s", ErrInvalid, category, why)
	}
	return nil
}

// prepare validates events for an append and returns copies with IDs
// assigned (random for an empty ID, lower-cased otherwise) and JSON copied.
// It does not check versions. Store implementations share it so that they
// reject the same input.
func prepare(events []NewEvent) ([]NewEvent, error) {
	out := make([]NewEvent, len(events))
	seen := make(map[string]struct{}, len(events))
	for i, e := range events {
		if err := validStream(e.Stream); err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if e.Type == "" {
			return nil, fmt.Errorf("event %d: stream %s: %w: empty type", i, e.Stream, ErrInvalid)
		}
		if why := jsonnul.RefusedText(e.Type); why != "" {
			return nil, fmt.Errorf("event %d: stream %s: %w: type %q: %s", i, e.Stream, ErrInvalid, e.Type, why)
		}
		if e.ExpectedVersion < AnyVersion {
			return nil, fmt.Errorf("event %d: stream %s: %w: expected version %d", i, e.Stream, ErrInvalid, e.ExpectedVersion)
		}
		if e.Data != nil && !json.Valid(e.Data) {
			return nil, fmt.Errorf("event %d: stream %s: %w: data is not JSON", i, e.Stream, ErrInvalid)
		}
		if e.Metadata != nil && !json.Valid(e.Metadata) {
			return nil, fmt.Errorf("event %d: stream %s: %w: metadata is not JSON", i, e.Stream, ErrInvalid)
		}
		if why := jsonnul.Refused(e.Data); why != "" {
			return nil, fmt.Errorf("event %d: stream %s: type %s: %w: data: %s", i, e.Stream, e.Type, ErrInvalid, why)
		}
		if why := jsonnul.Refused(e.Metadata); why != "" {
			return nil, fmt.Errorf("event %d: stream %s: type %s: %w: metadata: %s", i, e.Stream, e.Type, ErrInvalid, why)
		}
		if e.ID == "" {
			e.ID = NewID()
		} else {
			id, ok := canonicalUUID(e.ID)
			if !ok {
				return nil, fmt.Errorf("event %d: stream %s: %w: id %q is not a UUID", i, e.Stream, ErrInvalid, e.ID)
			}
			e.ID = id
		}
		if _, dup := seen[e.ID]; dup {
			return nil, fmt.Errorf("event %d: stream %s: id %s: %w", i, e.Stream, e.ID, ErrDuplicateID)
		}
		seen[e.ID] = struct{}{}
		e.Data = slices.Clone(e.Data)
		e.Metadata = slices.Clone(e.Metadata)
		out[i] = e
	}
	return out, nil
}

// NewID returns a random (version 4) UUID.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand.Read does not fail on supported platforms.
		panic("eventstore: crypto/rand: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// canonicalUUID accepts the 8-4-4-4-12 hex form in any case and returns it
// in lower case, the form PostgreSQL's uuid type returns.
func canonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return "", false
			}
		}
	}
	return strings.ToLower(s), true
}

// Size is what an event counts for against a read's byte bound
// (ReadStreamBytes): the length of its data and metadata.
func (e Event) Size() int { return len(e.Data) + len(e.Metadata) }

func limitOrDefault(limit int) int {
	if limit <= 0 {
		return DefaultLimit
	}
	return limit
}
