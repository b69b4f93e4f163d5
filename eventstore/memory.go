package eventstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/memtx"
)

// Memory is an in-process Store. It is safe for concurrent use.
//
// Writers are serialised by a write lock that a MemoryTx holds for its whole
// life; readers take a separate, short lock and never wait for a
// transaction. A goroutine that holds a MemoryTx must not call Append on the
// same Memory: it would wait for itself.
type Memory struct {
	now func() time.Time

	writeMu sync.Mutex // held by the one open MemoryTx

	mu         sync.RWMutex // guards the fields below
	events     []Event      // events[i].GlobalPosition == i+1
	streams    map[string][]int
	categories map[string][]int
	ids        map[string]struct{}
}

var (
	_ Store          = (*Memory)(nil)
	_ BackwardReader = (*Memory)(nil)
	_ Appender       = (*MemoryTx)(nil)
)

// NewMemory returns an empty memory store that stamps events with now; nil
// means time.Now.
func NewMemory(now func() time.Time) *Memory {
	if now == nil {
		now = time.Now
	}
	return &Memory{
		now:        now,
		streams:    make(map[string][]int),
		categories: make(map[string][]int),
		ids:        make(map[string]struct{}),
	}
}

// Begin opens a transaction. It blocks until no other transaction on m is
// open, and holds m's write lock until Commit or Rollback.
func (m *Memory) Begin() *MemoryTx {
	return &MemoryTx{m: m, life: memtx.Begin(&m.writeMu), versions: make(map[string]int64), ids: make(map[string]struct{})}
}

// Append appends events in a transaction of their own.
func (m *Memory) Append(ctx context.Context, events []NewEvent) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tx := m.Begin()
	defer tx.Rollback()
	out, err := tx.Append(ctx, events)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return out, nil
}

// ReadStream implements Store.
func (m *Memory) ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]Event, error) {
	return m.ReadStreamBytes(ctx, stream, fromPosition, limit, 0)
}

// ReadStreamBytes implements Store.
func (m *Memory) ReadStreamBytes(ctx context.Context, stream string, fromPosition int64, limit, maxBytes int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validStream(stream); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.streamLockedBytes(stream, fromPosition, limitOrDefault(limit), maxBytes), nil
}

// streamLocked returns events of stream from fromPosition; m.mu is held.
func (m *Memory) streamLocked(stream string, fromPosition int64, limit int) []Event {
	return m.streamLockedBytes(stream, fromPosition, limit, 0)
}

// streamLockedBytes is streamLocked within maxBytes (see
// Store.ReadStreamBytes); m.mu is held.
func (m *Memory) streamLockedBytes(stream string, fromPosition int64, limit, maxBytes int) []Event {
	idx := m.streams[stream]
	fromPosition = max(fromPosition, 0)
	if fromPosition >= int64(len(idx)) {
		return []Event{}
	}
	idx = idx[fromPosition:]
	idx = idx[:min(len(idx), limit)]
	if maxBytes > 0 {
		size := 0
		for i, at := range idx {
			if size += m.events[at].Size(); size > maxBytes && i > 0 {
				idx = idx[:i]
				break
			}
		}
	}
	return m.copyAt(idx)
}

// ReadCategory implements Store.
func (m *Memory) ReadCategory(ctx context.Context, category string, fromGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validCategory(category); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	idx := m.categories[category]
	first := sort.Search(len(idx), func(k int) bool { return m.events[idx[k]].GlobalPosition >= fromGlobal })
	idx = idx[first:]
	idx = idx[:min(len(idx), limitOrDefault(limit))]
	return m.copyAt(idx), nil
}

// ReadCategoryBackward implements BackwardReader: like Postgres's, its
// events hold their GlobalPosition and Data only.
func (m *Memory) ReadCategoryBackward(ctx context.Context, category string, afterGlobal, toGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validCategory(category); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	idx := m.categories[category]
	end := sort.Search(len(idx), func(k int) bool { return m.events[idx[k]].GlobalPosition > toGlobal })
	out := make([]Event, 0, min(end, limitOrDefault(limit)))
	for k := end - 1; k >= 0 && len(out) < cap(out); k-- {
		e := m.events[idx[k]]
		if e.GlobalPosition <= afterGlobal {
			break
		}
		out = append(out, Event{GlobalPosition: e.GlobalPosition, Data: slices.Clone(e.Data)})
	}
	return out, nil
}

// ReadAll implements Store.
func (m *Memory) ReadAll(ctx context.Context, fromGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	from := max(fromGlobal, 1) - 1
	if from >= int64(len(m.events)) {
		return []Event{}, nil
	}
	evs := m.events[from:]
	evs = evs[:min(len(evs), limitOrDefault(limit))]
	out := make([]Event, len(evs))
	for i, e := range evs {
		out[i] = copyEvent(e)
	}
	return out, nil
}

// StreamVersion implements Store.
func (m *Memory) StreamVersion(ctx context.Context, stream string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := validStream(stream); err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return int64(len(m.streams[stream])) - 1, nil
}

func (m *Memory) copyAt(idx []int) []Event {
	out := make([]Event, len(idx))
	for i, k := range idx {
		out[i] = copyEvent(m.events[k])
	}
	return out
}

// MemoryTx is a transaction on a Memory store. Appends are staged and
// become visible to readers at Commit. It is safe for concurrent use, though
// a unit of work normally drives it from one goroutine.
type MemoryTx struct {
	m *Memory

	life     *memtx.Life
	staged   []Event
	versions map[string]int64 // streams touched by staged events
	ids      map[string]struct{}
}

// Append checks and stages events. A failed Append stages nothing, and the
// transaction stays usable.
func (tx *MemoryTx) Append(ctx context.Context, events []NewEvent) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !tx.life.Enter() {
		return nil, tx.life.Done()
	}
	defer tx.life.Leave()
	prepared, err := prepare(events)
	if err != nil {
		return nil, err
	}

	m := tx.m
	m.mu.RLock()
	defer m.mu.RUnlock()
	now := m.now().UTC().Truncate(time.Microsecond)
	next := int64(len(m.events)+len(tx.staged)) + 1
	local := make(map[string]int64)
	out := make([]Event, len(prepared))
	for i, e := range prepared {
		if _, dup := m.ids[e.ID]; dup {
			return nil, fmt.Errorf("event %d: stream %s: id %s: %w", i, e.Stream, e.ID, ErrDuplicateID)
		}
		if _, dup := tx.ids[e.ID]; dup {
			return nil, fmt.Errorf("event %d: stream %s: id %s: %w", i, e.Stream, e.ID, ErrDuplicateID)
		}
		v, ok := local[e.Stream]
		if !ok {
			v = tx.versionLocked(e.Stream)
		}
		if e.ExpectedVersion != AnyVersion && e.ExpectedVersion != v {
			return nil, &VersionError{Stream: e.Stream, Expected: e.ExpectedVersion, Actual: v}
		}
		local[e.Stream] = v + 1
		out[i] = Event{
			ID:             e.ID,
			Stream:         e.Stream,
			Type:           e.Type,
			Position:       v + 1,
			GlobalPosition: next + int64(i),
			Time:           now,
			Data:           e.Data,
			Metadata:       e.Metadata,
		}
	}

	res := make([]Event, len(out))
	for i, e := range out {
		tx.staged = append(tx.staged, e)
		tx.ids[e.ID] = struct{}{}
		res[i] = copyEvent(e)
	}
	for s, v := range local {
		tx.versions[s] = v
	}
	return res, nil
}

// StreamVersion returns the stream's version counting staged events.
func (tx *MemoryTx) StreamVersion(ctx context.Context, stream string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := validStream(stream); err != nil {
		return 0, err
	}
	if !tx.life.Enter() {
		return 0, tx.life.Done()
	}
	defer tx.life.Leave()
	tx.m.mu.RLock()
	defer tx.m.mu.RUnlock()
	return tx.versionLocked(stream), nil
}

// ReadStream reads a stream as Memory.ReadStream does, followed by the
// events this transaction staged on it (read-your-writes).
func (tx *MemoryTx) ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validStream(stream); err != nil {
		return nil, err
	}
	if !tx.life.Enter() {
		return nil, tx.life.Done()
	}
	defer tx.life.Leave()
	limit = limitOrDefault(limit)
	tx.m.mu.RLock()
	out := tx.m.streamLocked(stream, fromPosition, limit)
	tx.m.mu.RUnlock()
	for _, e := range tx.staged {
		if len(out) >= limit {
			break
		}
		if e.Stream == stream && e.Position >= fromPosition {
			out = append(out, copyEvent(e))
		}
	}
	return out, nil
}

// versionLocked returns the stream's version counting staged events, inside
// one of the tx's operations and with tx.m.mu held.
func (tx *MemoryTx) versionLocked(stream string) int64 {
	if v, ok := tx.versions[stream]; ok {
		return v
	}
	return int64(len(tx.m.streams[stream])) - 1
}

// Commit publishes the staged events and releases the store's write lock.
// Committing twice is a no-op; committing after Rollback returns ErrTxDone.
func (tx *MemoryTx) Commit() error {
	return tx.life.Commit(func() {
		m := tx.m
		m.mu.Lock()
		for _, e := range tx.staged {
			k := len(m.events)
			m.events = append(m.events, e)
			m.streams[e.Stream] = append(m.streams[e.Stream], k)
			c := Category(e.Stream)
			m.categories[c] = append(m.categories[c], k)
			m.ids[e.ID] = struct{}{}
		}
		m.mu.Unlock()
		tx.staged = nil
	})
}

// Rollback discards the staged events and releases the store's write lock.
// It is a no-op after Commit or Rollback.
func (tx *MemoryTx) Rollback() {
	tx.life.Rollback(func() { tx.staged = nil })
}

func copyEvent(e Event) Event {
	e.Data = slices.Clone(e.Data)
	e.Metadata = slices.Clone(e.Metadata)
	return e
}
