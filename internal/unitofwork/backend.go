package unitofwork

import (
	"context"
	"sync"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// Tx is one transaction across the stores a unit of work writes: records,
// the event store, the outbox and the consumer positions. Nothing it stages is visible to
// others until Commit; Rollback discards all of it. On PostgreSQL it is one
// database transaction; in memory it holds each store's write lock.
type Tx interface {
	// Load reads a record, seeing this transaction's own writes.
	Load(ctx context.Context, key record.Key) (record.Record, error)
	// Write stages record writes, each checked against its expected version.
	Write(ctx context.Context, writes []record.Write) error
	// Append stages events, each checked against its expected version.
	Append(ctx context.Context, events []eventstore.NewEvent) ([]eventstore.Event, error)
	// Add stages outbox rows.
	Add(ctx context.Context, rows []outbox.Row) error
	// Advance checks a consumer's fence and stages its new positions
	// (position.ErrFenced, position.ErrApplied otherwise).
	Advance(ctx context.Context, f position.Fence) error
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Backend begins transactions.
type Backend interface {
	Begin(ctx context.Context) (Tx, error)
}

// Memory is the embedded backend over the four memory stores.
type Memory struct {
	Events    *eventstore.Memory
	Records   *record.Memory
	Outbox    *outbox.Memory
	Positions *position.Memory
}

// NewMemory returns a Memory backend with fresh stores.
func NewMemory() *Memory {
	m := &Memory{Events: eventstore.NewMemory(nil), Records: record.NewMemory(), Outbox: outbox.NewMemory(nil),
		Positions: position.NewMemory(nil)}
	m.Outbox.ReadPositions(m.Positions) // a republish keeps what the consumers applied
	return m
}

// Begin takes the stores' write locks, always in the same order (records,
// events, outbox, positions) so concurrent units of work cannot deadlock.
// Every unit of work takes the positions lock, fenced or not: they are
// serialised by the records lock already, so it costs no concurrency.
//
// Begin honours ctx: it returns ctx's error if ctx is done, and stops
// waiting for the locks when ctx ends. The locks are taken on a goroutine
// of their own (the stores' locks cannot be abandoned mid-wait); one that
// gets them after its Begin gave up releases them at once.
func (m *Memory) Begin(ctx context.Context) (Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Done() == nil { // cannot end: wait here
		return m.lock(), nil
	}
	h := &handoff{ready: make(chan struct{})}
	go func() {
		tx := m.lock()
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.abandoned {
			_ = tx.Rollback(context.Background())
			return
		}
		h.tx = tx
		close(h.ready)
	}()
	select {
	case <-h.ready:
		return h.tx, nil
	case <-ctx.Done():
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.tx != nil { // got the locks as ctx ended
			_ = h.tx.Rollback(context.Background())
		}
		h.abandoned = true
		return nil, ctx.Err()
	}
}

// handoff passes a transaction from the goroutine that waited for the
// locks to its Begin, or, once Begin has given up, to a rollback.
type handoff struct {
	mu        sync.Mutex
	abandoned bool
	tx        *memoryTx
	ready     chan struct{}
}

func (m *Memory) lock() *memoryTx {
	return &memoryTx{records: m.Records.Begin(), events: m.Events.Begin(), outbox: m.Outbox.Begin(),
		positions: m.Positions.Begin()}
}

type memoryTx struct {
	records   *record.MemoryTx
	events    *eventstore.MemoryTx
	outbox    *outbox.MemoryTx
	positions *position.MemoryTx
}

func (tx *memoryTx) Load(ctx context.Context, key record.Key) (record.Record, error) {
	return tx.records.Load(ctx, key)
}

func (tx *memoryTx) Write(ctx context.Context, writes []record.Write) error {
	return tx.records.Write(ctx, writes)
}

func (tx *memoryTx) Append(ctx context.Context, events []eventstore.NewEvent) ([]eventstore.Event, error) {
	return tx.events.Append(ctx, events)
}

func (tx *memoryTx) Add(ctx context.Context, rows []outbox.Row) error {
	return tx.outbox.Add(ctx, rows)
}

func (tx *memoryTx) Advance(ctx context.Context, f position.Fence) error {
	return tx.positions.Advance(ctx, f)
}

// Commit publishes the staged changes of all four stores. Each store's
// commit only applies what staging already checked under its lock, so it
// cannot fail midway except after a Rollback.
func (tx *memoryTx) Commit(context.Context) error {
	if err := tx.records.Commit(); err != nil {
		tx.events.Rollback()
		tx.outbox.Rollback()
		tx.positions.Rollback()
		return err
	}
	if err := tx.events.Commit(); err != nil {
		tx.outbox.Rollback()
		tx.positions.Rollback()
		return err
	}
	if err := tx.outbox.Commit(); err != nil {
		tx.positions.Rollback()
		return err
	}
	return tx.positions.Commit()
}

func (tx *memoryTx) Rollback(context.Context) error {
	tx.positions.Rollback()
	tx.outbox.Rollback()
	tx.events.Rollback()
	tx.records.Rollback()
	return nil
}
