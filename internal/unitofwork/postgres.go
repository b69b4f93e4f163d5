package unitofwork

import (
	"context"
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/internal/pipeline"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

func (t *postgresTx) writeKey(ctx context.Context, s *stage, events []eventstore.Event) error {
	var b pgx.Batch
	if _, err := queueKey(&b, s, events); err != nil {
		return err
	}
	if err := t.tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("unitofwork: idempotency key: %w", err)
	}
	return nil
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
		return fmt.Errorf("unitofwork: commit: %w", unknownIfSent(err))
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

// commitPipelined commits stages in one READ COMMITTED transaction in one
// round trip: BEGIN, the fences (one statement per unit of a run:
// position.Postgres.QueueAdvance), the record writes (one per record a
// run writes: record.QueueWrite), the category locks,
// one statement appending every event of the stages with their outbox
// rows (built in the database from the appended rows: outbox.Postgres.Rider),
// and COMMIT, in one pipeline. Every step raises when refused (a fence or
// a version that does not hold, a duplicate), and PostgreSQL skips the
// rest of a pipeline after an error, so COMMIT runs only when everything
// before it did. A stage that writes an idempotency key takes a second
// round trip: the key's answer holds the appended positions, so the key
// row and COMMIT follow the first. The category locks are taken once, by
// the appends, and held to commit, which covers the outbox rows of the
// same categories. Any refusal or error rolls the transaction back and is
// returned (the caller learns the typed error by running the work step by
// step).
func (p *Postgres) commitPipelined(ctx context.Context, stages []*stage, broker string, maxRetries int) (_ [][]eventstore.Event, err error) {
	var b pgx.Batch
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`)
	q, err := p.queueStages(&b, stages, broker, maxRetries)
	if err != nil {
		return nil, err
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("unitofwork: acquire: %w", err)
	}
	defer conn.Release()
	open := true // the transaction may be open: roll it back on the way out
	defer func() {
		if err != nil && open {
			// A failed statement leaves the transaction aborted (the rest of
			// the pipeline, COMMIT too, was skipped). A failed ROLLBACK
			// leaves the connection in a transaction; the pool destroys
			// such a connection on Release.
			_, _ = conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
		}
	}()
	if !q.keyed {
		b.Queue(`COMMIT`)
	}
	if err := sendBatch(ctx, conn, &b, q.readers, !q.keyed); err != nil {
		if !q.keyed {
			return nil, unknownIfSent(err)
		}
		return nil, err
	}
	out := split(stages, q.appended)
	if q.keyed {
		// The second round trip ends with COMMIT, skipped if a key write
		// fails.
		b = pgx.Batch{}
		readers, err := queueKeys(&b, stages, out)
		if err != nil {
			return nil, err
		}
		b.Queue(`COMMIT`)
		if err := sendBatch(ctx, conn, &b, readers, true); err != nil {
			return nil, unknownIfSent(err)
		}
	}
	open = false
	return out, nil
}

// queued is a unit of work's first pipeline: what reads its answers, the
// events its appends returned (once read), and whether a stage writes an
// idempotency key (then COMMIT waits for the second round trip).
type queued struct {
	readers  []pipeline.Reader
	appended []eventstore.Event
	keyed    bool
}

// queueStages queues on b, after its BEGIN, the stages' fenced advances
// (one statement per run), their record writes and their appends with the
// appends' outbox rows.
func (p *Postgres) queueStages(b *pgx.Batch, stages []*stage, broker string, maxRetries int) (*queued, error) {
	q := &queued{readers: make([]pipeline.Reader, 0, 4)}
	writes, events := 0, 0
	var fences []position.Fence
	for _, s := range stages {
		writes += len(s.writes)
		events += len(s.events)
		q.keyed = q.keyed || s.key != nil
		if s.fence != nil {
			fences = append(fences, *s.fence)
		}
	}
	if len(fences) > 0 {
		// A run's fences of one unit advance its row in one statement,
		// and its writes to one record are one write (record.QueueWrite).
		r, err := p.Positions.QueueAdvance(b, fences...)
		if err != nil {
			return nil, err
		}
		q.readers = append(q.readers, r)
	}
	if writes > 0 {
		all := stages[0].writes
		if len(stages) > 1 {
			all = make([]record.Write, 0, writes)
			for _, s := range stages {
				all = append(all, s.writes...)
			}
			sortWrites(all) // one lock order: each stage's are sorted already
		}
		r, err := record.QueueWrite(b, all)
		if err != nil {
			return nil, err
		}
		q.readers = append(q.readers, r)
	}
	if events > 0 {
		all := stages[0].events
		a := outbox.Appended{PartitionKeys: stages[0].keys, Priorities: stages[0].priorities, TargetBroker: broker, MaxRetries: maxRetries}
		if len(stages) > 1 {
			all = make([]eventstore.NewEvent, 0, events)
			a.PartitionKeys, a.Priorities = make([]*string, 0, events), make([]int, 0, events)
			for _, s := range stages {
				all = append(all, s.events...)
				a.PartitionKeys = append(a.PartitionKeys, s.keys...)
				a.Priorities = append(a.Priorities, s.priorities...)
			}
		}
		rider, err := p.Outbox.Rider(a)
		if err != nil {
			return nil, err
		}
		read, err := eventstore.QueueAppend(b, all, rider)
		if err != nil {
			return nil, err
		}
		q.readers = append(q.readers, func(br pgx.BatchResults) (err error) {
			q.appended, err = read(br)
			return err
		})
	}
	return q, nil
}

// queueKeys queues on b the idempotency key of each stage that has one,
// with its answer from the events the stage appended (out).
func queueKeys(b *pgx.Batch, stages []*stage, out [][]eventstore.Event) ([]pipeline.Reader, error) {
	var readers []pipeline.Reader
	for i, s := range stages {
		queued, err := queueKey(b, s, out[i])
		if err != nil {
			return nil, err
		}
		if queued {
			readers = append(readers, func(br pgx.BatchResults) error {
				if _, err := br.Exec(); err != nil {
					return fmt.Errorf("unitofwork: idempotency key: %w", err)
				}
				return nil
			})
		}
	}
	return readers, nil
}

// unknownIfSent marks err, the failure of a pipeline or statement that
// ends with COMMIT, with ErrCommitUnknown unless it proves nothing
// committed: the server's error (PostgreSQL skips COMMIT after one, and a
// failed COMMIT rolls back), a refusal read from the server's answer
// (pipeline.ErrRefused), a transaction pgx had rolled back, or a failure
// before anything was sent.
func unknownIfSent(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pipeline.ErrRefused) || errors.Is(err, pgx.ErrTxCommitRollback) ||
		pgconn.SafeToRetry(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
}

// split cuts the events appended for stages into each stage's.
func split(stages []*stage, appended []eventstore.Event) [][]eventstore.Event {
	out := make([][]eventstore.Event, len(stages))
	at := 0
	for i, s := range stages {
		n := len(s.events)
		if n > 0 {
			out[i] = appended[at : at+n : at+n]
		}
		at += n
	}
	return out
}

// sendBatch sends b on conn and reads it: BEGIN first if queued, the
// readers in order, then COMMIT if commit.
func sendBatch(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch, readers []pipeline.Reader, commit bool) (err error) {
	br := conn.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("unitofwork: pipeline: %w", cerr)
		}
	}()
	if b.QueuedQueries[0].SQL == `BEGIN ISOLATION LEVEL READ COMMITTED` {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("unitofwork: begin: %w", err)
		}
	}
	for _, r := range readers {
		if err := r(br); err != nil {
			return err
		}
	}
	if commit {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("unitofwork: commit: %w", err)
		}
	}
	return nil
}
