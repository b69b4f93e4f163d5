package outbox

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/dbtime"
	"github.com/proteanhq/protean-host/internal/memtx"
	"github.com/proteanhq/protean-host/position"
)

// Memory is an in-process Store. It is safe for concurrent use.
//
// Transactions that add rows are serialised by a write lock that a MemoryTx
// holds for its whole life; Claim, the marks and reads take a separate,
// short lock and never wait for a transaction.
type Memory struct {
	clock dbtime.Clock

	writeMu sync.Mutex // held by the one open MemoryTx

	mu     sync.Mutex // guards the fields below
	rows   []*Row     // ascending ID
	keys   map[dedupKey]struct{}
	lastID int64

	republishMu sync.Mutex        // Republish's lock, held across stillLost
	epochs      map[string]string // broker -> epoch, under mu
	leases      map[string]lease  // broker -> its relay lease, under mu
	// wakes are the relays' wake listeners by broker (ListenRelayWakes),
	// under mu.
	wakes map[string][]chan struct{}
	// positions is where Republish reads what the consumers applied
	// (nil: it keeps nothing).
	positions position.Store
}

type dedupKey struct{ messageID, broker string }

var _ Store = (*Memory)(nil)

// NewMemory returns an empty memory outbox that reads time from now; nil
// means time.Now.
func NewMemory(now func() time.Time) *Memory {
	return &Memory{clock: dbtime.NewClock(now), keys: make(map[dedupKey]struct{})}
}

// ClaimChained implements Chainer.
func (m *Memory) ClaimChained(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes Lanes) ([]Row, error) {
	rows, err := m.Claim(ctx, broker, owner, limit, lockFor)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range rows {
		r := &rows[i]
		if r.PartitionKey == nil {
			continue
		}
		k, lane := OrderingKeyOf(r), lanes.lane(*r)
		for j := len(m.rows) - 1; j >= 0; j-- { // newest first
			p := m.rows[j]
			if p.ID < r.ID && p.TargetBroker == broker && p.Status == StatusPublished && OrderingKeyOf(p) == k && lanes.lane(*p) == lane {
				if gp := globalPosition(p); gp > 0 {
					r.Prev = gp
					break
				}
			}
		}
	}
	return rows, nil
}

// ReadPositions makes Republish leave the rows that p says every
// consumer group of Keep applied, as the PostgreSQL store does with the
// table of consumer positions in its database. Call it before use.
func (m *Memory) ReadPositions(p position.Store) { m.positions = p }

// Begin opens a transaction. It blocks until no other transaction on m is
// open, and holds m's write lock until Commit or Rollback.
func (m *Memory) Begin() *MemoryTx {
	return &MemoryTx{m: m, life: memtx.Begin(&m.writeMu), keys: make(map[dedupKey]struct{})}
}

// Add adds rows in a transaction of their own.
func (m *Memory) Add(ctx context.Context, rows []Row) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx := m.Begin()
	defer tx.Rollback()
	if err := tx.Add(ctx, rows); err != nil {
		return err
	}
	return tx.Commit()
}

// Claim implements Store.
func (m *Memory) Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]Row, error) {
	limit, lockFor, err := claimArgs(ctx, broker, owner, limit, lockFor)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	// A key's rows are claimable while every earlier active row of the key
	// is claimable too; the first active row that is not (locked, waiting
	// for its retry) blocks the rest of its key.
	var picked []*Row
	blocked := make(map[OrderingKey]struct{})
	for _, r := range m.rows { // ascending ID
		if r.TargetBroker != broker || !active(r) {
			continue
		}
		k := OrderingKeyOf(r)
		if _, ok := blocked[k]; ok {
			continue
		}
		if !eligible(r, now) {
			blocked[k] = struct{}{}
			continue
		}
		picked = append(picked, r)
	}
	// m.rows is in ID order, so a stable sort keeps ID order within a
	// priority; the limit takes the first rows of that order.
	sort.SliceStable(picked, func(i, j int) bool { return picked[i].Priority > picked[j].Priority })
	picked = prefixes(m.rows, broker, picked[:min(len(picked), limit)])
	until := now.Add(lockFor)
	out := make([]Row, len(picked))
	for i, r := range picked {
		r.Status = StatusProcessing
		r.LockedBy = owner
		u := until
		r.LockedUntil = &u
		out[i] = copyRow(*r)
	}
	claimOrder(out)
	return out, nil
}

// prefixes keeps of picked the rows whose every earlier active row of
// their key is picked too: the limit may have cut a key's earlier row of a
// lower priority, and its later rows must wait for it.
func prefixes(rows []*Row, broker string, picked []*Row) []*Row {
	in := make(map[*Row]bool, len(picked))
	for _, r := range picked {
		in[r] = true
	}
	cut := map[OrderingKey]bool{}
	for _, r := range rows { // ascending ID
		if r.TargetBroker != broker || !active(r) {
			continue
		}
		if k := OrderingKeyOf(r); !in[r] {
			cut[k] = true
		} else if cut[k] {
			in[r] = false
		}
	}
	return slices.DeleteFunc(picked, func(r *Row) bool { return !in[r] })
}

// MarkPublished implements Store.
func (m *Memory) MarkPublished(ctx context.Context, id int64, owner string) error {
	return m.markOwned(ctx, id, owner, func(r *Row, now time.Time) {
		r.Status = StatusPublished
		r.PublishedAt = &now
		r.NextRetryAt = nil
	})
}

// MarkPublishedBatch implements Store.
func (m *Memory) MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error {
	return m.batchOwned(ctx, "mark published", owner, ids, func(r *Row, now time.Time) {
		r.Status = StatusPublished
		r.PublishedAt = &now
		r.NextRetryAt = nil
	})
}

// Release implements Store.
func (m *Memory) Release(ctx context.Context, owner string, ids []int64) error {
	return m.batchOwned(ctx, "release", owner, ids, func(r *Row, _ time.Time) {
		r.Status = StatusPending
		r.NextRetryAt = nil
	})
}

// batchOwned applies mark to each row of ids that owner holds, and names
// the ones it does not.
func (m *Memory) batchOwned(ctx context.Context, op, owner string, ids []int64, mark func(r *Row, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	var missed []int64
	for _, id := range ids {
		r := m.findLocked(id)
		if r == nil || r.Status != StatusProcessing || r.LockedBy != owner {
			missed = append(missed, id)
			continue
		}
		mark(r, now)
		r.LockedBy = ""
		r.LockedUntil = nil
	}
	if len(missed) > 0 {
		return fmt.Errorf("%s: outbox rows %v: %w", op, missed, ErrNotOwner)
	}
	return nil
}

// MarkFailed implements Store.
func (m *Memory) MarkFailed(ctx context.Context, id int64, owner, errMsg string, nextRetryAt time.Time) error {
	next := dbtime.Of(nextRetryAt)
	return m.markOwned(ctx, id, owner, func(r *Row, _ time.Time) {
		r.RetryCount++
		r.LastError = errMsg
		if r.RetryCount >= r.MaxRetries {
			r.Status = givenUp(r)
			r.NextRetryAt = nil
			return
		}
		r.Status = StatusFailed
		r.NextRetryAt = &next
	})
}

func (m *Memory) markOwned(ctx context.Context, id int64, owner string, mark func(r *Row, now time.Time)) error {
	return m.withRow(ctx, id, func(r *Row) error {
		if r.Status != StatusProcessing || r.LockedBy != owner {
			return fmt.Errorf("outbox row %d: %s, locked by %q, not %q: %w", id, r.Status, r.LockedBy, owner, ErrNotOwner)
		}
		mark(r, m.clock.Now())
		r.LockedBy, r.LockedUntil = "", nil
		return nil
	})
}

// withRow runs fn on row id under the store's lock, or returns ErrNotFound.
func (m *Memory) withRow(ctx context.Context, id int64, fn func(r *Row) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.findLocked(id)
	if r == nil {
		return fmt.Errorf("outbox row %d: %w", id, ErrNotFound)
	}
	return fn(r)
}

// Abandon implements Store.
func (m *Memory) Abandon(ctx context.Context, id int64, reason string) error {
	return m.withRow(ctx, id, func(r *Row) error {
		if r.Status == StatusPublished {
			return fmt.Errorf("outbox row %d: abandon a %s row: %w", id, r.Status, ErrStatus)
		}
		r.Status = StatusAbandoned
		r.LastError = reason
		r.NextRetryAt, r.LockedUntil, r.LockedBy = nil, nil, ""
		return nil
	})
}

// Retry implements Store.
func (m *Memory) Retry(ctx context.Context, id int64) error {
	return m.withRow(ctx, id, func(r *Row) error {
		if r.Status != StatusFailed && r.Status != StatusAbandoned && r.Status != StatusHalted {
			return fmt.Errorf("outbox row %d: retry a %s row: %w", id, r.Status, ErrStatus)
		}
		if r.Status == StatusAbandoned && r.PartitionKey != nil {
			k := OrderingKeyOf(r)
			for _, later := range m.rows {
				if later.ID > r.ID && later.Status == StatusPublished && OrderingKeyOf(later) == k {
					return fmt.Errorf("outbox row %d: row %d of key %s was published after it: %w", id, later.ID, k.key, ErrPassed)
				}
			}
		}
		r.Status = StatusPending
		r.RetryCount = 0
		r.NextRetryAt, r.LockedUntil, r.LockedBy = nil, nil, ""
		return nil
	})
}

// Cleanup implements Store.
func (m *Memory) Cleanup(ctx context.Context, publishedBefore, abandonedBefore time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.rows[:0]
	n := 0
	for _, r := range m.rows {
		if r.Status == StatusPublished && r.PublishedAt.Before(publishedBefore) ||
			r.Status == StatusAbandoned && r.CreatedAt.Before(abandonedBefore) {
			delete(m.keys, dedupKey{r.MessageID, r.TargetBroker})
			n++
			continue
		}
		kept = append(kept, r)
	}
	clear(m.rows[len(kept):])
	m.rows = kept
	return n, nil
}

// Stats implements Store.
func (m *Memory) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{Counts: make(map[Status]int, len(statuses))}
	for _, st := range statuses {
		s.Counts[st] = 0
	}
	for _, r := range m.rows {
		s.Counts[r.Status]++
		switch r.Status {
		case StatusPending:
			if s.OldestPending == nil || r.CreatedAt.Before(*s.OldestPending) {
				at := r.CreatedAt
				s.OldestPending = &at
			}
		case StatusAbandoned, StatusHalted:
			if len(s.Abandoned) < maxStatsAbandoned {
				s.Abandoned = append(s.Abandoned, Abandoned{
					ID:           r.ID,
					Status:       r.Status,
					Category:     r.Category,
					Key:          deref(r.PartitionKey),
					MessageID:    r.MessageID,
					TargetBroker: r.TargetBroker,
					RetryCount:   r.RetryCount,
					LastError:    r.LastError,
					CreatedAt:    r.CreatedAt,
				})
			}
		}
	}
	for broker, l := range m.leases {
		s.RelayLeases = append(s.RelayLeases, RelayLease{Broker: broker, Owner: l.owner, Expires: l.expires})
	}
	slices.SortFunc(s.RelayLeases, func(a, b RelayLease) int { return strings.Compare(a.Broker, b.Broker) })
	return s, nil
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, id int64) (Row, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.findLocked(id)
	if r == nil {
		return Row{}, fmt.Errorf("outbox row %d: %w", id, ErrNotFound)
	}
	return copyRow(*r), nil
}

func (m *Memory) findLocked(id int64) *Row {
	i := sort.Search(len(m.rows), func(i int) bool { return m.rows[i].ID >= id })
	if i < len(m.rows) && m.rows[i].ID == id {
		return m.rows[i]
	}
	return nil
}

// MemoryTx is a transaction on a Memory outbox. Added rows become visible,
// and get their IDs, at Commit. It is safe for concurrent use, though a
// unit of work normally drives it from one goroutine.
type MemoryTx struct {
	m *Memory

	life   *memtx.Life
	staged []Row
	keys   map[dedupKey]struct{}
}

// Add checks and stages rows. A failed Add stages nothing, and the
// transaction stays usable. Add sets every field the store owns (ID,
// Status, RetryCount, the lock and retry times, LastError, CreatedAt,
// PublishedAt), whatever the caller put there.
func (tx *MemoryTx) Add(ctx context.Context, rows []Row) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prepared, err := prepare(rows, tx.m.clock.Now())
	if err != nil {
		return err
	}
	if !tx.life.Enter() {
		return tx.life.Done()
	}
	defer tx.life.Leave()
	local := make(map[dedupKey]struct{}, len(prepared))
	tx.m.mu.Lock()
	for _, r := range prepared {
		k := dedupKey{r.MessageID, r.TargetBroker}
		_, live := tx.m.keys[k]
		_, staged := tx.keys[k]
		_, batch := local[k]
		if live || staged || batch {
			tx.m.mu.Unlock()
			return fmt.Errorf("outbox: message %s for broker %s: %w", r.MessageID, r.TargetBroker, ErrDuplicate)
		}
		local[k] = struct{}{}
	}
	tx.m.mu.Unlock()
	for k := range local {
		tx.keys[k] = struct{}{}
	}
	tx.staged = append(tx.staged, prepared...)
	return nil
}

// Commit makes the staged rows claimable and releases the store's write
// lock. Committing twice is a no-op; committing after Rollback returns
// ErrTxDone.
func (tx *MemoryTx) Commit() error {
	return tx.life.Commit(func() {
		m := tx.m
		m.mu.Lock()
		for i := range tx.staged {
			r := tx.staged[i]
			m.lastID++
			r.ID = m.lastID
			m.rows = append(m.rows, &r)
			m.keys[dedupKey{r.MessageID, r.TargetBroker}] = struct{}{}
		}
		m.mu.Unlock()
		tx.staged = nil
	})
}

// Rollback discards the staged rows and releases the store's write lock.
// It is a no-op after Commit or Rollback.
func (tx *MemoryTx) Rollback() {
	tx.life.Rollback(func() { tx.staged = nil })
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// LastPublished implements Republisher.
func (m *Memory) LastPublished(_ context.Context, broker string) (time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var last time.Time
	for _, r := range m.rows {
		if r.TargetBroker == broker && r.Status == StatusPublished && r.PublishedAt != nil && r.PublishedAt.After(last) {
			last = *r.PublishedAt
		}
	}
	return last, nil
}

// Republish implements Republisher.
func (m *Memory) Republish(ctx context.Context, broker, epoch string, since time.Time, keep Keep,
	stillLost func(context.Context) (bool, error)) (int, bool, error) {
	m.republishMu.Lock()
	defer m.republishMu.Unlock()
	if lost, err := stillLost(ctx); err != nil || !lost {
		return 0, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epochs == nil {
		m.epochs = map[string]string{}
	}
	_, marked := m.epochs[broker]
	since = dbtime.Of(since)
	var others map[string][]position.Row
	if marked {
		var err error
		if others, err = unitRows(ctx, m.positions); err != nil {
			return 0, false, err
		}
	}
	n := 0
	for _, r := range m.rows {
		switch {
		case r.TargetBroker != broker:
		case marked && r.Status == StatusPublished && !r.PublishedAt.Before(since):
			applied, err := keep.applied(ctx, m.positions, others, r)
			if err != nil {
				return 0, false, err
			}
			if applied {
				continue
			}
			r.Status, r.PublishedAt, r.RetryCount, r.NextRetryAt = StatusPending, nil, 0, nil
			n++
		case r.Status == StatusProcessing: // every claim is revoked
			r.Status, r.LockedBy, r.LockedUntil = StatusPending, "", nil
			if r.NextRetryAt != nil {
				r.Status = StatusFailed
			}
		}
	}
	m.epochs[broker] = epoch
	return n, !marked, nil
}
