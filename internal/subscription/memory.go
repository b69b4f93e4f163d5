package subscription

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/position"
)

type unitKey struct{ group, unit string }

// MemoryLeases are Leases inside one process (the embedded default, where
// one host is all there is). Now is the clock; nil means time.Now.
type MemoryLeases struct {
	Now func() time.Time

	mu     sync.Mutex
	leases map[unitKey]memLease
}

type memLease struct {
	owner   string
	expires time.Time
}

var _ Leases = (*MemoryLeases)(nil)

func (m *MemoryLeases) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Acquire implements Leases.
func (m *MemoryLeases) Acquire(_ context.Context, group, unit, owner string, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leases == nil {
		m.leases = map[unitKey]memLease{}
	}
	k, now := unitKey{group, unit}, m.now()
	if l, ok := m.leases[k]; ok && l.owner != owner && now.Before(l.expires) {
		return false, nil
	}
	m.leases[k] = memLease{owner: owner, expires: now.Add(ttl)}
	return true, nil
}

// Renew implements Leases.
func (m *MemoryLeases) Renew(_ context.Context, group, unit, owner string, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := unitKey{group, unit}
	if l, ok := m.leases[k]; !ok || l.owner != owner {
		return false, nil
	}
	m.leases[k] = memLease{owner: owner, expires: m.now().Add(ttl)}
	return true, nil
}

// Release implements Leases.
func (m *MemoryLeases) Release(_ context.Context, group, unit, owner string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := unitKey{group, unit}
	if l, ok := m.leases[k]; ok && l.owner == owner {
		delete(m.leases, k)
	}
	return nil
}

// Holder implements Leases.
func (m *MemoryLeases) Holder(_ context.Context, group, unit string) (string, time.Time, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[unitKey{group, unit}]
	return l.owner, l.expires, ok, nil
}

// MemoryFailures are Failures in memory. Now is the clock; nil means
// time.Now. Positions is the store Park advances its fence in (the one the
// consumer claims in); Park refuses to run without it.
type MemoryFailures struct {
	Now       func() time.Time
	Positions *position.Memory

	mu   sync.Mutex
	recs map[unitKey]map[int64]Failure
}

var _ Failures = (*MemoryFailures)(nil)

func (m *MemoryFailures) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Record implements Failures.
func (m *MemoryFailures) Record(_ context.Context, f Failure) error {
	if err := validFailure(f); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recordLocked(f)
	return nil
}

func (m *MemoryFailures) recordLocked(f Failure) {
	if m.recs == nil {
		m.recs = map[unitKey]map[int64]Failure{}
	}
	k := unitKey{f.Group, f.Unit}
	if m.recs[k] == nil {
		m.recs[k] = map[int64]Failure{}
	}
	now := m.now().UTC()
	if old, ok := m.recs[k][f.GlobalPosition]; ok {
		f.FailedAt = old.FailedAt
	} else {
		f.FailedAt = now
	}
	f.Updated = now
	m.recs[k][f.GlobalPosition] = f
}

// Park implements Failures: the fence is checked and staged in a
// transaction of Positions (holding its write lock, as an effect
// transaction does), and the record is written under the records' lock
// only once that transaction has committed.
func (m *MemoryFailures) Park(ctx context.Context, f Failure, fence position.Fence) error {
	if err := validPark(f, fence); err != nil {
		return err
	}
	if m.Positions == nil {
		return fmt.Errorf("subscription: MemoryFailures.Positions is nil: Park has no positions to advance: %w", ErrInvalid)
	}
	tx := m.Positions.Begin()
	defer tx.Rollback()
	if err := tx.Advance(ctx, fence); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := tx.Commit(); err != nil {
		return err
	}
	m.recordLocked(f)
	return nil
}

// List implements Failures.
func (m *MemoryFailures) List(_ context.Context, group, unit string, open bool) ([]Failure, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Failure
	for k, recs := range m.recs {
		if (group != "" && k.group != group) || (unit != "" && k.unit != unit) {
			continue
		}
		for _, f := range recs {
			if !open || f.Status.Open() {
				out = append(out, f)
			}
		}
	}
	slices.SortFunc(out, func(a, b Failure) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Unit, b.Unit), cmp.Compare(a.GlobalPosition, b.GlobalPosition))
	})
	return out, nil
}

// Mark implements Failures.
func (m *MemoryFailures) Mark(_ context.Context, group, unit string, pos int64, action string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.recs[unitKey{group, unit}][pos]
	if !ok {
		return notFound(group, unit, pos)
	}
	st, err := nextStatus(group, unit, pos, f.Status, action)
	if err != nil {
		return err
	}
	f.Status, f.Updated = st, m.now().UTC()
	m.recs[unitKey{group, unit}][pos] = f
	return nil
}

// Resolve implements Failures.
func (m *MemoryFailures) Resolve(_ context.Context, group, unit string, pos int64, status Status, attempts int, msg string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.recs[unitKey{group, unit}][pos]
	if !ok {
		return notFound(group, unit, pos)
	}
	f.Status, f.Attempts, f.Error, f.Updated = status, attempts, msg, m.now().UTC()
	m.recs[unitKey{group, unit}][pos] = f
	return nil
}

// Settle implements Failures, as Park does: the source's removal staged in
// a transaction of Positions, the record updated under the records' lock
// once that transaction has committed.
func (m *MemoryFailures) Settle(ctx context.Context, group, unit string, pos int64, attempts int, generation int64) error {
	if m.Positions == nil {
		return fmt.Errorf("subscription: MemoryFailures.Positions is nil: Settle has no positions: %w", ErrInvalid)
	}
	tx := m.Positions.Begin()
	defer tx.Rollback()
	if _, err := tx.Forget(ctx, group, unit, generation, RetrySource(pos)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.recs[unitKey{group, unit}][pos]
	if !ok {
		return notFound(group, unit, pos)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	f.Status, f.Attempts, f.Error, f.Updated = StatusResolved, attempts, "", m.now().UTC()
	m.recs[unitKey{group, unit}][pos] = f
	return nil
}
