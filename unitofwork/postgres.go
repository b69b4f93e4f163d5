package unitofwork

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// Postgres is the production backend: the record store, the event store,
// the outbox and the consumer positions in one PostgreSQL database
// (migrated by package schema), and one READ COMMITTED transaction per unit
// of work, so the record writes, the appends, the outbox rows and a fenced
// advance commit or roll back together.
// The stores' own methods (loads, reads, claims) use the same pool.
type Postgres struct {
	pool      *pgxpool.Pool
	Events    *eventstore.Postgres
	Records   *record.Postgres
	Outbox    *outbox.Postgres
	Positions *position.Postgres
}

var _ Backend = (*Postgres)(nil)

// NewPostgres returns a backend on pool's database. The outbox and the
// positions read time from time.Now.
func NewPostgres(pool *pgxpool.Pool) *Postgres {
	return &Postgres{
		pool:      pool,
		Events:    eventstore.NewPostgres(pool),
		Records:   record.NewPostgres(pool),
		Outbox:    outbox.NewPostgres(pool, nil),
		Positions: position.NewPostgres(pool, nil),
	}
}

// Begin opens one database transaction. Each step of it (Write, Append,
// Add, Advance) runs under a savepoint where it must, so a step that fails leaves
// nothing of itself behind and the transaction usable.
func (p *Postgres) Begin(ctx context.Context) (Tx, error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("unitofwork: begin: %w", err)
	}
	return &postgresTx{tx: tx, records: p.Records.Tx(tx), events: p.Events.Tx(tx), outbox: p.Outbox.Tx(tx),
		positions: p.Positions.Tx(tx)}, nil
}

// postgresTx is for one goroutine at a time, like the pgx.Tx under it.
type postgresTx struct {
	tx        pgx.Tx
	records   *record.PostgresTx
	events    *eventstore.PostgresTx
	outbox    *outbox.PostgresTx
	positions *position.PostgresTx

	committed, rolledBack bool
}

func (t *postgresTx) Load(ctx context.Context, key record.Key) (record.Record, error) {
	return t.records.Load(ctx, key)
}

func (t *postgresTx) Write(ctx context.Context, writes []record.Write) error {
	return t.records.Write(ctx, writes)
}

func (t *postgresTx) Append(ctx context.Context, events []eventstore.NewEvent) ([]eventstore.Event, error) {
	return t.events.Append(ctx, events)
}

func (t *postgresTx) Add(ctx context.Context, rows []outbox.Row) error {
	return t.outbox.Add(ctx, rows)
}

func (t *postgresTx) Advance(ctx context.Context, f position.Fence) error {
	return t.positions.Advance(ctx, f)
}

// Commit commits the transaction. Committing twice is a no-op; after
// Rollback it fails with record.ErrTxDone, as the memory backend does.
func (t *postgresTx) Commit(ctx context.Context) error {
	switch {
	case t.committed:
		return nil
	case t.rolledBack:
		return record.ErrTxDone
	}
	if err := t.tx.Commit(ctx); err != nil {
		// pgx rolls back what it cannot commit (ErrTxCommitRollback: an
		// earlier statement failed outside a savepoint).
		t.rolledBack = true
		return fmt.Errorf("unitofwork: commit: %w", err)
	}
	t.committed = true
	return nil
}

// Rollback rolls the transaction back; after Commit or Rollback it is a
// no-op.
func (t *postgresTx) Rollback(ctx context.Context) error {
	if t.committed || t.rolledBack {
		return nil
	}
	t.rolledBack = true
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("unitofwork: rollback: %w", err)
	}
	return nil
}
