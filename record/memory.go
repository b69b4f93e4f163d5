package record

import (
	"context"
	"slices"
	"sync"

	"github.com/proteanhq/protean-host/internal/memtx"
)

// Memory is an in-process Store. It is safe for concurrent use.
//
// Writers are serialised by a write lock that a MemoryTx holds for its whole
// life; readers take a separate, short lock and never wait for a
// transaction. A goroutine that holds a MemoryTx must not call Commit on the
// same Memory: it would wait for itself.
type Memory struct {
	writeMu sync.Mutex // held by the one open MemoryTx

	mu      sync.RWMutex // guards records
	records map[Key]entry
}

type entry struct {
	version int64
	data    []byte
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty memory store.
func NewMemory() *Memory {
	return &Memory{records: make(map[Key]entry)}
}

// Begin opens a transaction. It blocks until no other transaction on m is
// open, and holds m's write lock until Commit or Rollback.
func (m *Memory) Begin() *MemoryTx {
	return &MemoryTx{m: m, life: memtx.Begin(&m.writeMu), staged: make(map[Key]entry)}
}

// Load implements Store.
func (m *Memory) Load(ctx context.Context, key Key) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if err := validKey(key); err != nil {
		return Record{}, err
	}
	m.mu.RLock()
	e := m.records[key]
	m.mu.RUnlock()
	return e.record(key), nil
}

// Commit implements Store in a transaction of its own.
func (m *Memory) Commit(ctx context.Context, writes []Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx := m.Begin()
	defer tx.Rollback()
	if err := tx.Write(ctx, writes); err != nil {
		return err
	}
	return tx.Commit()
}

func (e entry) record(key Key) Record {
	return Record{Key: key, Version: e.version, Data: slices.Clone(e.data)}
}

// MemoryTx is a transaction on a Memory store. It is safe for concurrent
// use, though a unit of work normally drives it from one goroutine.
type MemoryTx struct {
	m *Memory

	life   *memtx.Life
	staged map[Key]entry
}

// Load returns the record as this transaction would leave it: its own
// staged writes first, the committed record otherwise.
func (tx *MemoryTx) Load(ctx context.Context, key Key) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if err := validKey(key); err != nil {
		return Record{}, err
	}
	if !tx.life.Enter() {
		return Record{}, tx.life.Done()
	}
	defer tx.life.Leave()
	return tx.currentLocked(key).record(key), nil
}

// Write checks writes against the records as this transaction sees them
// and stages them, all or nothing. A failed Write stages nothing, and the
// transaction stays usable.
func (tx *MemoryTx) Write(ctx context.Context, writes []Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prepared, err := prepare(writes)
	if err != nil {
		return err
	}
	if !tx.life.Enter() {
		return tx.life.Done()
	}
	defer tx.life.Leave()
	local := make(map[Key]entry, len(prepared))
	for _, w := range prepared {
		cur, ok := local[w.Key]
		if !ok {
			cur = tx.currentLocked(w.Key)
		}
		if cur.version != w.ExpectedVersion {
			return &VersionError{Key: w.Key, Expected: w.ExpectedVersion, Actual: cur.version}
		}
		local[w.Key] = entry{version: w.ExpectedVersion + 1, data: w.Data}
	}
	for k, e := range local {
		tx.staged[k] = e
	}
	return nil
}

// currentLocked returns the staged or committed entry for key, inside one of
// the tx's operations. The committed records cannot change meanwhile: tx holds the write
// lock.
func (tx *MemoryTx) currentLocked(key Key) entry {
	if e, ok := tx.staged[key]; ok {
		return e
	}
	tx.m.mu.RLock()
	defer tx.m.mu.RUnlock()
	return tx.m.records[key]
}

// Commit merges the staged writes into the store, record by record, and
// releases the store's write lock. Committing twice is a no-op; committing
// after Rollback returns ErrTxDone.
func (tx *MemoryTx) Commit() error {
	return tx.life.Commit(func() {
		m := tx.m
		m.mu.Lock()
		for k, e := range tx.staged {
			m.records[k] = e
		}
		m.mu.Unlock()
		tx.staged = nil
	})
}

// Rollback discards the staged writes and releases the store's write lock.
// It is a no-op after Commit or Rollback.
func (tx *MemoryTx) Rollback() {
	tx.life.Rollback(func() { tx.staged = nil })
}
