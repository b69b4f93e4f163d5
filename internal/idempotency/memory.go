package idempotency

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Memory is the embedded default's Store. It is safe for concurrent use.
type Memory struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	locks map[string]*memLock
	rows  map[string]memRow
	saves int
}

// memLock is one key's lock: a buffered channel of one, held while full;
// refs counts the requests holding or waiting for it, so it is dropped
// when none is.
type memLock struct {
	ch   chan struct{}
	refs int
}

type memRow struct {
	hash    []byte
	answer  Answer
	expires time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns a store that keeps answers for ttl (DefaultTTL if
// <= 0), reading time from now (nil: time.Now).
func NewMemory(ttl time.Duration, now func() time.Time) *Memory {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now == nil {
		now = time.Now
	}
	return &Memory{ttl: ttl, now: now, locks: map[string]*memLock{}, rows: map[string]memRow{}}
}

func memKey(r Request) string { return r.Scope + "\x00" + r.Key }

// Begin implements Store.
func (m *Memory) Begin(ctx context.Context, r Request) (*Answer, func(answered bool), error) {
	if err := validRequest(r); err != nil {
		return nil, nil, err
	}
	k := memKey(r)
	m.mu.Lock()
	lock, ok := m.locks[k]
	if !ok {
		lock = &memLock{ch: make(chan struct{}, 1)}
		m.locks[k] = lock
	}
	lock.refs++
	m.mu.Unlock()
	unref := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if lock.refs--; lock.refs == 0 {
			delete(m.locks, k)
		}
	}
	select {
	case lock.ch <- struct{}{}:
	case <-ctx.Done():
		unref()
		return nil, nil, ctx.Err()
	}
	done := func(bool) {
		<-lock.ch
		unref()
	}
	m.mu.Lock()
	row, ok := m.rows[k]
	if ok && !m.now().Before(row.expires) {
		delete(m.rows, k)
		ok = false
	}
	m.mu.Unlock()
	if !ok {
		return nil, done, nil
	}
	a, err := check(r, row.hash, row.answer)
	if err != nil {
		done(false)
		return nil, nil, err
	}
	return a, done, nil
}

// Save implements Store. Every 100th Save sweeps the expired keys.
func (m *Memory) Save(ctx context.Context, r Request, a Answer) error {
	if err := validRequest(r); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.rows[memKey(r)] = memRow{hash: slices.Clone(r.Hash), answer: Answer{Status: a.Status, Body: slices.Clone(a.Body)}, expires: now.Add(m.ttl)}
	m.saves++
	if m.saves%100 == 0 {
		for k, row := range m.rows {
			if !now.Before(row.expires) {
				delete(m.rows, k)
			}
		}
	}
	return nil
}

// Len returns how many keys the store holds, expired ones not yet purged
// included (for tests).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows)
}
