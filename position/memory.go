package position

import (
	"context"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/dbtime"
	"github.com/proteanhq/protean-host/internal/memtx"
)

// Memory is an in-process Store, the positions of the embedded default. It
// is safe for concurrent use.
//
// Every change (a MemoryTx, Claim, Set) holds the store's write lock, so a
// Claim waits for an open effect transaction to end, as PostgreSQL's row
// lock makes it wait there: a new owner never reads positions that a
// committing predecessor is about to move. Reads take a separate, short
// lock and never wait. A goroutine holding a MemoryTx must not call Claim
// or Set on the same Memory: it would wait for itself.
type Memory struct {
	clock dbtime.Clock

	writeMu sync.Mutex // held by the one open MemoryTx, Claim or Set

	mu   sync.RWMutex // guards rows
	rows map[unitKey]*Row
}

type unitKey struct{ group, unit string }

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store that reads time from now; nil means
// time.Now.
func NewMemory(now func() time.Time) *Memory {
	return &Memory{clock: dbtime.NewClock(now), rows: make(map[unitKey]*Row)}
}

// Begin opens a transaction. It blocks until no other change on m is under
// way, and holds m's write lock until Commit or Rollback.
func (m *Memory) Begin() *MemoryTx {
	return &MemoryTx{m: m, life: memtx.Begin(&m.writeMu), staged: make(map[unitKey]*Row)}
}

// Claim implements Store: ClaimAll of one unit.
func (m *Memory) Claim(ctx context.Context, group, unit string) (Row, error) {
	rows, err := m.ClaimAll(ctx, group, []string{unit})
	if err != nil {
		return Row{}, err
	}
	return rows[0], nil
}

// ClaimAll implements Store: the claims in one change.
func (m *Memory) ClaimAll(ctx context.Context, group string, units []string) ([]Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validUnits(group, units); err != nil {
		return nil, err
	}
	out := make([]Row, len(units))
	err := m.change(func(tx *MemoryTx) {
		for i, unit := range units {
			r := tx.row(unitKey{group, unit}, true)
			r.Generation++
			r.UpdatedAt = m.clock.Now()
			out[i] = copyRow(r)
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Set implements Store.
func (m *Memory) Set(ctx context.Context, group, unit, source string, pos int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validSet(group, unit, source, pos); err != nil {
		return err
	}
	return m.change(func(tx *MemoryTx) {
		r := tx.row(unitKey{group, unit}, true)
		r.Positions[source] = pos
		r.UpdatedAt = m.clock.Now()
	})
}

// change runs fn in a transaction of its own and commits it.
func (m *Memory) change(fn func(tx *MemoryTx)) error {
	tx := m.Begin()
	defer tx.Rollback()
	if !tx.life.Enter() {
		return tx.life.Done()
	}
	fn(tx)
	tx.life.Leave()
	return tx.Commit()
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, group, unit string) (Row, bool, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, false, err
	}
	if err := validUnit(group, unit); err != nil {
		return Row{}, false, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.rows[unitKey{group, unit}]
	if !ok {
		return Row{}, false, nil
	}
	return copyRow(r), true, nil
}

// List implements Store.
func (m *Memory) List(ctx context.Context, group string) ([]Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.RLock()
	out := make([]Row, 0, len(m.rows))
	for k, r := range m.rows {
		if group == "" || k.group == group {
			out = append(out, copyRow(r))
		}
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Group != out[j].Group {
			return out[i].Group < out[j].Group
		}
		return out[i].Unit < out[j].Unit
	})
	return out, nil
}

func copyRow(r *Row) Row {
	c := *r
	c.Positions = maps.Clone(r.Positions)
	if c.Positions == nil {
		c.Positions = map[string]int64{}
	}
	return c
}

// MemoryTx is a transaction on a Memory store: it holds the store's write
// lock from Begin to Commit or Rollback, so what Advance checked still
// holds at Commit. It is safe for concurrent use, though a unit of work
// drives it from one goroutine.
type MemoryTx struct {
	m *Memory

	life   *memtx.Life
	staged map[unitKey]*Row // copies of the rows this transaction changed
}

// row returns the transaction's copy of a row: staged, else a copy of the
// live one, else (when create) a new one at generation 0, else nil.
func (tx *MemoryTx) row(k unitKey, create bool) *Row {
	if r, ok := tx.staged[k]; ok {
		return r
	}
	tx.m.mu.RLock()
	live, ok := tx.m.rows[k]
	tx.m.mu.RUnlock()
	switch {
	case ok:
		c := copyRow(live)
		tx.staged[k] = &c
		return &c
	case create:
		r := &Row{Group: k.group, Unit: k.unit, Positions: map[string]int64{}}
		tx.staged[k] = r
		return r
	}
	return nil
}

// Advance checks f against the row as this transaction sees it and stages
// the new positions: *FenceError if the generation differs or the row is
// missing, *AppliedError if a source would not move forward. A failed
// Advance stages nothing, and the transaction stays usable.
func (tx *MemoryTx) Advance(ctx context.Context, f Fence) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validFence(f); err != nil {
		return err
	}
	if !tx.life.Enter() {
		return tx.life.Done()
	}
	defer tx.life.Leave()
	k := unitKey{f.Group, f.Unit}
	// Check before staging a copy, so that a failure leaves no trace.
	var cur *Row
	if r, ok := tx.staged[k]; ok {
		cur = r
	} else {
		tx.m.mu.RLock()
		cur = tx.m.rows[k]
		tx.m.mu.RUnlock()
	}
	if cur == nil {
		return check(f, false, 0, nil)
	}
	if err := check(f, true, cur.Generation, cur.Positions); err != nil {
		return err
	}
	r := tx.row(k, false)
	for src, pos := range f.Advance {
		r.Positions[src] = pos
	}
	r.UpdatedAt = tx.m.clock.Now()
	return nil
}

// Forget stages the removal of source from the unit's row if the row
// holds generation, and reports whether it does; a missing row, another
// generation or an absent source stage nothing (see [PostgresTx.Forget]).
func (tx *MemoryTx) Forget(ctx context.Context, group, unit string, generation int64, source string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := validUnit(group, unit); err != nil {
		return false, err
	}
	if !tx.life.Enter() {
		return false, tx.life.Done()
	}
	defer tx.life.Leave()
	k := unitKey{group, unit}
	cur, ok := tx.staged[k]
	if !ok {
		tx.m.mu.RLock()
		cur = tx.m.rows[k]
		tx.m.mu.RUnlock()
	}
	if cur == nil || cur.Generation != generation {
		return false, nil
	}
	if _, ok := cur.Positions[source]; !ok {
		return true, nil
	}
	r := tx.row(k, false)
	delete(r.Positions, source)
	r.UpdatedAt = tx.m.clock.Now()
	return true, nil
}

// Commit applies the staged rows and releases the write lock. Committing
// twice is a no-op; committing after Rollback returns ErrTxDone.
func (tx *MemoryTx) Commit() error {
	return tx.life.Commit(func() {
		tx.m.mu.Lock()
		for k, r := range tx.staged {
			tx.m.rows[k] = r
		}
		tx.m.mu.Unlock()
		tx.staged = nil
	})
}

// Rollback discards the staged rows and releases the write lock. It is a
// no-op after Commit or Rollback.
func (tx *MemoryTx) Rollback() {
	tx.life.Rollback(func() { tx.staged = nil })
}
