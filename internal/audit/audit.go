package audit

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Entry is one recorded action.
type Entry struct {
	// ID orders the entries: a later action has a greater ID.
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Principal names who acted: an API key's id ("key:" and the first 12
	// hex digits of its hash), a token's issuer and subject, or "cli:" and
	// the local user for the CLI's direct access.
	Principal string `json:"principal"`
	// Tenant is the tenant the target belongs to ("" for the whole host).
	Tenant string `json:"tenant"`
	// Action is the verb, as "partitions.resume" or "modules.put".
	Action string `json:"action"`
	// Target names what was acted on, as "order:c-1 group Orders".
	Target string `json:"target"`
	// Outcome is "ok", or the error the action ended with.
	Outcome string `json:"outcome"`
	// Reason is the operator's own explanation, if given.
	Reason string `json:"reason,omitempty"`
}

// OK is the outcome of an action that succeeded.
const OK = "ok"

// Outcome is OK for a nil err, else err's message.
func Outcome(err error) string {
	if err == nil {
		return OK
	}
	return err.Error()
}

// Query selects entries: the newest first, at most Limit (DefaultLimit if
// zero, MaxLimit at most), before ID Before if set, of the tenants
// Tenants (nil: every tenant; an empty non-nil list: none).
type Query struct {
	Tenants []string
	Before  int64
	Limit   int
}

// DefaultLimit and MaxLimit bound a Query's answer.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

func (q Query) limit() int {
	switch {
	case q.Limit <= 0:
		return DefaultLimit
	case q.Limit > MaxLimit:
		return MaxLimit
	}
	return q.Limit
}

// MaxFieldBytes bounds each text field of an entry: a long reason or a
// long error is cut, so one entry stays small.
const MaxFieldBytes = 1024

// Log keeps the entries.
type Log interface {
	// Append records e (its ID and, if zero, its time are the log's) and
	// returns its ID.
	Append(ctx context.Context, e Entry) (int64, error)
	// List returns the entries q selects, newest first.
	List(ctx context.Context, q Query) ([]Entry, error)
}

// ErrInvalid is wrapped by the errors of an entry without an action.
var ErrInvalid = errors.New("invalid audit entry")

// clip bounds every text field of e.
func clip(e Entry) (Entry, error) {
	if e.Action == "" {
		return e, errors.Join(ErrInvalid, errors.New("an audit entry needs an action"))
	}
	for _, f := range []*string{&e.Principal, &e.Tenant, &e.Action, &e.Target, &e.Outcome, &e.Reason} {
		if len(*f) > MaxFieldBytes {
			*f = (*f)[:MaxFieldBytes]
		}
	}
	return e, nil
}

// Memory is a Log in memory, for the embedded host and tests.
type Memory struct {
	mu      sync.Mutex
	entries []Entry
	now     func() time.Time
}

// NewMemory returns an empty Memory log whose times come from now (nil:
// time.Now).
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{now: now}
}

// Append implements Log.
func (m *Memory) Append(ctx context.Context, e Entry) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	e, err := clip(e)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e.ID = int64(len(m.entries)) + 1
	if e.At.IsZero() {
		e.At = m.now()
	}
	m.entries = append(m.entries, e)
	return e.ID, nil
}

// List implements Log.
func (m *Memory) List(ctx context.Context, q Query) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Entry{}
	for i := len(m.entries) - 1; i >= 0 && len(out) < q.limit(); i-- {
		e := m.entries[i]
		if (q.Before > 0 && e.ID >= q.Before) || (q.Tenants != nil && !slices.Contains(q.Tenants, e.Tenant)) {
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
