package record

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/proteanhq/protean-host/internal/pipeline"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Postgres is a Store in the records table of a database migrated by
// package schema. It is safe for concurrent use, and needs nothing stronger
// than READ COMMITTED.
//
// Each write is one conditional statement that PostgreSQL re-checks under
// the row lock against committed state: an update is
// UPDATE … WHERE version = expected, a first write (expected 0) is
// INSERT … ON CONFLICT DO NOTHING. Zero rows affected means the record has
// moved; the version reported in the *VersionError is read afterwards.
type Postgres struct {
	pool *pgxpool.Pool
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a store on pool's database.
func NewPostgres(pool *pgxpool.Pool) *Postgres { return &Postgres{pool: pool} }

// Tx returns a view of the store inside tx, the caller's transaction: its
// writes commit or roll back with tx, and its loads see them.
func (p *Postgres) Tx(tx pgx.Tx) *PostgresTx { return &PostgresTx{tx: tx} }

// querier is what the store needs of a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Load implements Store.
func (p *Postgres) Load(ctx context.Context, key Key) (Record, error) {
	return pgLoad(ctx, p.pool, key)
}

// Commit implements Store: the writes in a transaction of their own.
func (p *Postgres) Commit(ctx context.Context, writes []Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		return p.Tx(tx).Write(ctx, writes)
	})
}

// PostgresTx is the record store inside a caller's pgx transaction. Like
// the pgx.Tx under it, it is for one goroutine at a time.
type PostgresTx struct {
	tx pgx.Tx
}

// Load returns the record as this transaction sees it, its own writes
// included.
func (t *PostgresTx) Load(ctx context.Context, key Key) (Record, error) {
	return pgLoad(ctx, t.tx, key)
}

// Write checks and applies writes inside the transaction, all or nothing:
// a batch of several runs under a savepoint, so a failed Write leaves
// nothing behind and the transaction stays usable. (A single write that
// fails its version check changes nothing, so it needs no savepoint.)
func (t *PostgresTx) Write(ctx context.Context, writes []Write) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prepared, err := prepare(writes)
	if err != nil {
		return err
	}
	switch len(prepared) {
	case 0:
		return nil
	case 1:
		return pgWrite(ctx, t.tx, prepared[0])
	}
	if _, err := t.tx.Exec(ctx, `SAVEPOINT protean_write`); err != nil {
		return pgError("savepoint", err)
	}
	for _, w := range prepared {
		if err := pgWrite(ctx, t.tx, w); err != nil {
			if _, rbErr := t.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT protean_write; RELEASE SAVEPOINT protean_write`); rbErr != nil {
				return errors.Join(err, pgError("roll back to savepoint", rbErr))
			}
			return err
		}
	}
	if _, err := t.tx.Exec(ctx, `RELEASE SAVEPOINT protean_write`); err != nil {
		return pgError("release savepoint", err)
	}
	return nil
}

func pgLoad(ctx context.Context, q querier, key Key) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if err := validKey(key); err != nil {
		return Record{}, err
	}
	r := Record{Key: key}
	var data []byte
	err := q.QueryRow(ctx, `SELECT version, data FROM records WHERE kind = $1 AND type = $2 AND id = $3`,
		key.Kind, key.Type, key.ID).Scan(&r.Version, &data)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, nil
	case err != nil:
		return Record{}, pgError("load "+key.String(), err)
	}
	r.Data = slices.Clone(data)
	return r, nil
}

// pgWrite applies one prepared write as one conditional statement.
func pgWrite(ctx context.Context, q querier, w Write) error {
	var (
		tag pgconn.CommandTag
		err error
	)
	sql, args := writeSQL(w)
	tag, err = q.Exec(ctx, sql, args...)
	if err != nil {
		return pgError("write "+w.Key.String(), err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var actual int64
	err = q.QueryRow(ctx, `SELECT coalesce((SELECT version FROM records WHERE kind = $1 AND type = $2 AND id = $3), 0)`,
		w.Key.Kind, w.Key.Type, w.Key.ID).Scan(&actual)
	if err != nil {
		return pgError("read version of "+w.Key.String(), err)
	}
	return &VersionError{Key: w.Key, Expected: w.ExpectedVersion, Actual: actual}
}

func pgError(what string, err error) error {
	if txdone.Closed(err) {
		return ErrTxDone
	}
	return fmt.Errorf("record: %s: %w", what, err)
}

// jsonArg passes JSON to a json parameter as written (records.data is json,
// not jsonb, so that it reads back byte for byte); nil is SQL NULL.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// writeSQL is one prepared write as one conditional statement, which
// changes one row or none (a version that does not hold).
func writeSQL(w Write) (string, []any) {
	if w.ExpectedVersion == 0 {
		return insertSQL + ` ON CONFLICT (kind, type, id) DO NOTHING`, writeArgs(w, 1)
	}
	return updateSQL, writeArgs(w, 1)
}

// writeArgs are the arguments of insertSQL or updateSQL for w, moving the
// version by steps (1 for one write, more for a chain).
func writeArgs(w Write, steps int64) []any {
	args := []any{w.Key.Kind, w.Key.Type, w.Key.ID, jsonArg(w.Data)}
	if w.ExpectedVersion == 0 {
		return append(args, steps)
	}
	return append(args, w.ExpectedVersion, steps)
}

// The writes take the version step as a parameter ($5 of the insert, $6
// of the update), so that one statement stands for a chain of writes
// (chain).
const (
	insertSQL = `INSERT INTO records (kind, type, id, version, data, updated_at) VALUES ($1, $2, $3, $5, $4, now())`
	updateSQL = `UPDATE records SET version = version + $6, data = $4, updated_at = now()
			WHERE kind = $1 AND type = $2 AND id = $3 AND version = $5`
)

// The pipelined writes raise when refused: a first write by the unique
// violation (the record exists), an update through pipeline.Count.
var (
	queuedInsertSQL = insertSQL
	queuedUpdateSQL = pipeline.Count(updateSQL, "1", "record write")
)

// chained is a chain of writes to one record as one write: the first's
// expected version, the last's data, and Steps, how many writes the
// chain holds (the version moves by that much).
type chained struct {
	Write
	Steps int64
}

// chain folds each record's chain of writes, in order, into one: a write
// to a record whose previous write in writes left it at the version this
// one expects goes into that write's chain. A run of messages that each
// update one projection writes it once, not once per message: the same
// record afterwards, and refused exactly when the writes one by one would
// be (the chain's first expected version does not hold). A write that
// expects another version starts a chain of its own, after the other, so
// the pipeline refuses it as it would have.
func chain(writes []Write) []chained {
	out := make([]chained, 0, len(writes))
	last := make(map[Key]int, len(writes)) // key -> index in out of its latest chain
	for _, w := range writes {
		if i, ok := last[w.Key]; ok && out[i].ExpectedVersion+out[i].Steps == w.ExpectedVersion {
			out[i].Data = w.Data
			out[i].Steps++
			continue
		}
		last[w.Key] = len(out)
		out = append(out, chained{Write: w, Steps: 1})
	}
	return out
}

// QueueWrite queues writes on b, a pipeline inside a transaction, as one
// statement per chain of writes to a record (chain), each made to raise
// when it changes no row (a version that does not hold), so that nothing
// queued after it runs, a COMMIT least of all. It returns the reader of
// their results, which fails with pipeline.ErrRefused then (run Write to
// learn the *VersionError). Input is checked as Write checks it.
func QueueWrite(b *pgx.Batch, writes []Write) (pipeline.Reader, error) {
	checked, err := prepare(writes)
	if err != nil {
		return nil, err
	}
	prepared := chain(checked)
	sql, args, all := queueAll(prepared)
	statements := len(prepared)
	if all {
		b.Queue(sql, args...)
		statements = 1
	} else {
		for _, w := range prepared {
			sql := queuedUpdateSQL
			if w.ExpectedVersion == 0 {
				sql = queuedInsertSQL // a first write refused raises by itself: the row exists
			}
			b.Queue(sql, writeArgs(w.Write, w.Steps)...)
		}
	}
	return func(br pgx.BatchResults) error {
		for i := range statements {
			if _, err := br.Exec(); err != nil {
				if pipeline.Refused(err) {
					err = pipeline.ErrRefused
				}
				if all {
					return pgError(fmt.Sprintf("write %d records from %s", len(prepared), prepared[0].Key), err)
				}
				return pgError("write "+prepared[i].Key.String(), err)
			}
		}
		return nil
	}, nil
}

// queueAll is the one statement for several chains that are all first
// writes (insertAllSQL) or all updates (updateAllSQL), with its arguments;
// ok is false for one chain, or a mix of both, which go one statement per
// chain. A grouped transaction's writes (a record each of many runs or
// commands) then cost the server one statement, not one each. The chains
// are in key order (sortWrites in the unit of work), and each statement
// takes its rows in the order of its arrays, as the statements one by one
// would (see updateAllSQL). It is refused exactly when one
// of the statements one by one would be: a first write of a record that
// exists violates the primary key, and an update that changes fewer rows
// than it has chains raises (a version that does not hold, or a second
// chain of one record, which expects a version the first does not leave).
func queueAll(chains []chained) (string, []any, bool) {
	if len(chains) < 2 {
		return "", nil, false
	}
	inserts := chains[0].ExpectedVersion == 0
	n := len(chains)
	kinds, types, ids := make([]string, n), make([]string, n), make([]string, n)
	data := make([]*string, n)
	expected, steps := make([]int64, n), make([]int64, n)
	for i, c := range chains {
		if (c.ExpectedVersion == 0) != inserts {
			return "", nil, false
		}
		kinds[i], types[i], ids[i] = c.Key.Kind, c.Key.Type, c.Key.ID
		if c.Data != nil {
			d := string(c.Data)
			data[i] = &d
		}
		expected[i], steps[i] = c.ExpectedVersion, c.Steps
	}
	if inserts {
		return insertAllSQL, []any{kinds, types, ids, data, steps}, true
	}
	return updateAllSQL, []any{kinds, types, ids, data, expected, steps}, true
}

// insertAllSQL and updateAllSQL are insertSQL and updateSQL for arrays of
// writes, in array order. The update's plan must be a nested loop from the
// arrays into the primary key, an index probe a write, whatever the size
// of the table when the plan was made: a connection keeps a statement's
// generic plan, and one made while records was small (a new database)
// was a hash join over a scan of the whole table, which it kept as the
// table grew (20-30 ms a statement under make load). The LIMIT, which
// never drops a row, is what keeps it a nested loop: a generic plan
// counts a limit it cannot read as a tenth of its input, one row here,
// and one probe costs less than any scan of the table (EXPLAIN, plan made
// at 0 rows and kept: a nested loop over records_pkey at 0, 30, 1,300 and
// 50,000 rows).
const (
	insertAllSQL = `INSERT INTO records (kind, type, id, version, data, updated_at)
		SELECT w.kind, w.type, w.id, w.steps, w.data::json, now()
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) WITH ORDINALITY AS w(kind, type, id, data, steps, ord)
		ORDER BY w.ord`
	updateAllDML = `UPDATE records r SET version = r.version + w.steps, data = w.data::json, updated_at = now()
		FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[])
			AS u(kind, type, id, data, expected, steps) LIMIT cardinality($3::text[])) w
		WHERE r.kind = w.kind AND r.type = w.type AND r.id = w.id AND r.version = w.expected`
)

var updateAllSQL = pipeline.Count(updateAllDML, "cardinality($1::text[])", "record writes")
