package eventstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/proteanhq/protean-host/internal/pipeline"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Postgres is a Store in a PostgreSQL database migrated by package schema:
// MessageDB's message_store.messages. A batch is written through
// MessageDB's write_message, a single event by one statement that does
// what write_message does without raising. It is safe for concurrent use.
//
// An append holds the advisory lock of each category it writes until its
// transaction ends, as write_message does, so appends to one category
// commit in global_position order and a category read never sees a hole
// that a later commit fills. Appends to different categories run in
// parallel; across categories global_position may have gaps (a rolled-back
// append consumes values). A transaction that appends to several
// categories in separate Appends, while another takes them in the other
// order, can deadlock; PostgreSQL then aborts one of them (SQLSTATE 40P01),
// and its unit of work fails and may be retried.
//
// An event's Time is its transaction's start (now() in UTC), as MessageDB
// records it.
type Postgres struct {
	pool *pgxpool.Pool
}

var (
	_ Store    = (*Postgres)(nil)
	_ Appender = (*PostgresTx)(nil)
)

// NewPostgres returns a store on pool's database.
func NewPostgres(pool *pgxpool.Pool) *Postgres { return &Postgres{pool: pool} }

// Tx returns a view of the store inside tx, the caller's transaction: its
// appends commit or roll back with tx.
func (p *Postgres) Tx(tx pgx.Tx) *PostgresTx { return &PostgresTx{tx: tx} }

// querier is what the store needs of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Append appends events in a transaction of their own: one pipelined round
// trip, which PostgreSQL runs as one implicit transaction.
func (p *Postgres) Append(ctx context.Context, events []NewEvent) ([]Event, error) {
	return pgAppend(ctx, p.pool, events, false)
}

// ReadStream implements Store.
func (p *Postgres) ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]Event, error) {
	return pgReadStream(ctx, p.pool, stream, fromPosition, limit)
}

// ReadCategory implements Store.
func (p *Postgres) ReadCategory(ctx context.Context, category string, fromGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validCategory(category); err != nil {
		return nil, err
	}
	// The predicate matches MessageDB's messages_category index.
	return pgRead(ctx, p.pool, `SELECT `+eventColumns+` FROM message_store.messages
		WHERE message_store.category(stream_name) = $1 AND global_position >= $2
		ORDER BY global_position LIMIT $3`, category, fromGlobal, limitOrDefault(limit))
}

// ReadAll implements Store.
func (p *Postgres) ReadAll(ctx context.Context, fromGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return pgRead(ctx, p.pool, `SELECT `+eventColumns+` FROM message_store.messages
		WHERE global_position >= $1 ORDER BY global_position LIMIT $2`, fromGlobal, limitOrDefault(limit))
}

// StreamVersion implements Store.
func (p *Postgres) StreamVersion(ctx context.Context, stream string) (int64, error) {
	return pgStreamVersion(ctx, p.pool, stream)
}

// PostgresTx is the event store inside a caller's pgx transaction. Its
// reads see the transaction's own appends. Like the pgx.Tx under it, it is
// for one goroutine at a time.
type PostgresTx struct {
	tx pgx.Tx
}

// Append checks and appends events inside the transaction. A failed
// Append leaves nothing behind, and the transaction stays usable: a batch
// runs under a savepoint, and a single event's append fails without an
// error in the database.
func (t *PostgresTx) Append(ctx context.Context, events []NewEvent) ([]Event, error) {
	return pgAppend(ctx, t.tx, events, true)
}

// StreamVersion returns the stream's version, counting this transaction's
// appends.
func (t *PostgresTx) StreamVersion(ctx context.Context, stream string) (int64, error) {
	return pgStreamVersion(ctx, t.tx, stream)
}

// ReadStream reads a stream as Postgres.ReadStream does, seeing this
// transaction's appends.
func (t *PostgresTx) ReadStream(ctx context.Context, stream string, fromPosition int64, limit int) ([]Event, error) {
	return pgReadStream(ctx, t.tx, stream, fromPosition, limit)
}

const eventColumns = `id::text, stream_name, type, position, global_position, time, data, metadata`

// pgAppend appends events in one pipelined round trip, holding the
// category locks to commit. A single event takes the fast path
// (pgAppendOne); a batch goes through MessageDB's write_message.
func pgAppend(ctx context.Context, q querier, events []NewEvent, inTx bool) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prepared, err := prepare(events)
	if err != nil {
		return nil, err
	}
	switch len(prepared) {
	case 0:
		return []Event{}, nil
	case 1:
		return pgAppendOne(ctx, q, prepared[0])
	}
	return pgAppendBatch(ctx, q, prepared, inTx)
}

// appendOneSQL is write_message's check and insert as one statement that
// fails by returning no row instead of raising, so that it needs no
// savepoint inside a caller's transaction. It runs after the category lock
// is taken, so its snapshot sees every earlier append of the category.
const appendOneSQL = `INSERT INTO message_store.messages (id, stream_name, position, type, data, metadata)
	SELECT $1, $2, v.version + 1, $3, $4, $5
	FROM (SELECT coalesce(max(position), -1) AS version FROM message_store.messages WHERE stream_name = $2) v
	WHERE $6::bigint IS NULL OR v.version = $6
	ON CONFLICT (id) DO NOTHING
	RETURNING position, global_position, time`

// pgAppendOne appends one event: the category lock and a conditional
// insert in one round trip, and one more only to explain a refusal.
func pgAppendOne(ctx context.Context, q querier, e NewEvent) ([]Event, error) {
	var b pgx.Batch
	b.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64($1))`, Category(e.Stream))
	b.Queue(appendOneSQL, e.ID, e.Stream, e.Type, jsonArg(e.Data), jsonArg(e.Metadata), expectedArg(e.ExpectedVersion))
	out := Event{ID: e.ID, Stream: e.Stream, Type: e.Type, Data: e.Data, Metadata: e.Metadata}
	br := q.SendBatch(ctx, &b)
	_, err := br.Exec()
	inserted := false
	if err == nil {
		err = br.QueryRow().Scan(&out.Position, &out.GlobalPosition, &out.Time)
		inserted = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	prepared := []NewEvent{e}
	if err != nil {
		return nil, mapAppendError(err, prepared, 0)
	}
	if inserted {
		out.Time = out.Time.UTC()
		return []Event{out}, nil
	}
	// Refused: a duplicate id, or the stream is not at the expected version.
	var version int64
	var dup bool
	err = q.QueryRow(ctx, `SELECT (SELECT coalesce(max(position), -1) FROM message_store.messages WHERE stream_name = $1),
		EXISTS (SELECT 1 FROM message_store.messages WHERE id = $2)`, e.Stream, e.ID).Scan(&version, &dup)
	if err != nil {
		return nil, mapAppendError(err, prepared, 0)
	}
	if dup {
		return nil, fmt.Errorf("event 0: stream %s: id %s: %w", e.Stream, e.ID, ErrDuplicateID)
	}
	return nil, &VersionError{Stream: e.Stream, Expected: e.ExpectedVersion, Actual: version}
}

// pgAppendBatch runs a batch as one pipeline: the category locks in a
// fixed order (so batches spanning categories do not deadlock each other),
// then one write_message per event, which checks the expected version
// counting the batch's earlier events exactly as MessageDB does and raises
// on a mismatch. Outside a transaction PostgreSQL runs the pipeline as one
// implicit transaction; inside the caller's, it runs under a savepoint so
// that a failure undoes only this append.
func pgAppendBatch(ctx context.Context, q querier, prepared []NewEvent, inTx bool) ([]Event, error) {
	var b pgx.Batch
	if inTx {
		b.Queue(`SAVEPOINT protean_append`)
	}
	var categories []string
	for _, e := range prepared {
		categories = append(categories, Category(e.Stream))
	}
	slices.Sort(categories)
	categories = slices.Compact(categories)
	for _, c := range categories {
		b.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64($1))`, c)
	}
	for _, e := range prepared {
		// write_message's insert took the next value of the sequence, and
		// stamped the row with the transaction's now().
		b.Queue(`SELECT p, currval('message_store.messages_global_position_seq'), now() AT TIME ZONE 'utc'
			FROM message_store.write_message($1, $2, $3, $4, $5, $6) AS p`,
			e.ID, e.Stream, e.Type, jsonArg(e.Data), jsonArg(e.Metadata), expectedArg(e.ExpectedVersion))
	}
	if inTx {
		b.Queue(`RELEASE SAVEPOINT protean_append`)
	}

	out, err := readAppendBatch(q.SendBatch(ctx, &b), prepared, inTx, len(categories))
	if err != nil {
		if inTx && !errors.Is(err, ErrTxDone) {
			if rbErr := rollbackTo(ctx, q.(pgx.Tx), "protean_append"); rbErr != nil {
				return nil, errors.Join(err, rbErr)
			}
		}
		return nil, err
	}
	return out, nil
}

// readAppendBatch reads the pipeline pgAppendBatch queued and closes it.
func readAppendBatch(br pgx.BatchResults, prepared []NewEvent, inTx bool, categories int) (out []Event, err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = mapAppendError(cerr, prepared, -1)
		}
	}()
	head := categories
	if inTx {
		head++
	}
	for range head {
		if _, err := br.Exec(); err != nil {
			return nil, mapAppendError(err, prepared, -1)
		}
	}
	out = make([]Event, len(prepared))
	for i, e := range prepared {
		out[i] = Event{ID: e.ID, Stream: e.Stream, Type: e.Type, Data: e.Data, Metadata: e.Metadata}
		if err := br.QueryRow().Scan(&out[i].Position, &out[i].GlobalPosition, &out[i].Time); err != nil {
			return nil, mapAppendError(err, prepared, i)
		}
		out[i].Time = out[i].Time.UTC()
	}
	if inTx {
		if _, err := br.Exec(); err != nil {
			return nil, mapAppendError(err, prepared, -1)
		}
	}
	return out, nil
}

// expectedArg passes an expected version to write_message: NULL for no
// check.
func expectedArg(v int64) any {
	if v == AnyVersion {
		return nil
	}
	return v
}

// mapAppendError turns a database error into the store's: write_message's
// expected-version exception into a *VersionError for event i, a
// duplicate id into ErrDuplicateID, a closed transaction into ErrTxDone.
func mapAppendError(err error, prepared []NewEvent, i int) error {
	if txdone.Closed(err) {
		return ErrTxDone
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "P0001" && strings.HasPrefix(pgErr.Message, "Wrong expected version: ") && i >= 0:
			e := prepared[i]
			actual, ok := parseStreamVersion(pgErr.Message)
			if !ok {
				break
			}
			return &VersionError{Stream: e.Stream, Expected: e.ExpectedVersion, Actual: actual}
		case pgErr.Code == "23505" && pgErr.ConstraintName == "messages_id":
			if i >= 0 {
				e := prepared[i]
				return fmt.Errorf("event %d: stream %s: id %s: %w", i, e.Stream, e.ID, ErrDuplicateID)
			}
			return fmt.Errorf("eventstore: %w", ErrDuplicateID)
		}
	}
	if i >= 0 {
		return fmt.Errorf("eventstore: append event %d to %s: %w", i, prepared[i].Stream, err)
	}
	return fmt.Errorf("eventstore: append: %w", err)
}

// parseStreamVersion reads the stream version from write_message's
// message: "Wrong expected version: E (Stream: S, Stream Version: V)". The
// stream name may hold anything, so it reads from the end.
func parseStreamVersion(msg string) (int64, bool) {
	const marker = ", Stream Version: "
	k := strings.LastIndex(msg, marker)
	if k < 0 || !strings.HasSuffix(msg, ")") {
		return 0, false
	}
	v, err := strconv.ParseInt(msg[k+len(marker):len(msg)-1], 10, 64)
	return v, err == nil
}

// rollbackTo undoes a failed step of the caller's transaction.
func rollbackTo(ctx context.Context, tx pgx.Tx, savepoint string) error {
	_, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT `+savepoint+`; RELEASE SAVEPOINT `+savepoint)
	if err != nil {
		return fmt.Errorf("eventstore: roll back to savepoint: %w", err)
	}
	return nil
}

func pgReadStream(ctx context.Context, q querier, stream string, fromPosition int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validStream(stream); err != nil {
		return nil, err
	}
	return pgRead(ctx, q, `SELECT `+eventColumns+` FROM message_store.messages
		WHERE stream_name = $1 AND position >= $2 ORDER BY position LIMIT $3`, stream, fromPosition, limitOrDefault(limit))
}

func pgRead(ctx context.Context, q querier, sql string, args ...any) ([]Event, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, readError(err)
	}
	out := []Event{}
	var (
		e          Event
		data, meta []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.Stream, &e.Type, &e.Position, &e.GlobalPosition, &e.Time, &data, &meta}, func() error {
		e.Time = e.Time.UTC()
		e.Data = slices.Clone(data)
		e.Metadata = slices.Clone(meta)
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, readError(err)
	}
	return out, nil
}

func pgStreamVersion(ctx context.Context, q querier, stream string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := validStream(stream); err != nil {
		return 0, err
	}
	var v int64
	err := q.QueryRow(ctx, `SELECT coalesce(max(position), -1) FROM message_store.messages WHERE stream_name = $1`, stream).Scan(&v)
	if err != nil {
		return 0, readError(err)
	}
	return v, nil
}

func readError(err error) error {
	if txdone.Closed(err) {
		return ErrTxDone
	}
	return fmt.Errorf("eventstore: %w", err)
}

// jsonArg passes JSON to a jsonb parameter; nil is SQL NULL.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// Rider is a statement that rides with each append QueueAppend queues,
// inside the same SQL statement, so that it sees the appended row without
// looking it up: a data-modifying statement without a RETURNING clause
// that reads the row from the relation "appended" (columns id,
// stream_name, type, position, global_position, time, data, metadata) and
// raises when it cannot do its part. Its parameters are numbered from $7;
// Args gives those of event i. The outbox's rows ride this way
// (outbox.Postgres.Rider).
type Rider struct {
	SQL  string
	Args func(i int) []any
}

// queuedAppendInsert is appendOneSQL's insert raising when refused: a duplicate
// id violates messages_id, and a stream not at the expected version gets
// a NULL position, which violates its NOT NULL (v.version is a value of
// the query, so the planner cannot fold the CASE into a constant NULL).
const queuedAppendInsert = `INSERT INTO message_store.messages (id, stream_name, position, type, data, metadata)
	SELECT $1, $2, CASE WHEN $6::bigint IS NULL OR v.version = $6 THEN v.version + 1 END, $3, $4, $5
	FROM (SELECT coalesce(max(position), -1) AS version FROM message_store.messages WHERE stream_name = $2) v`

// queuedAppendSQL is queuedAppendInsert with rider's statement, if any, in
// the same statement.
func queuedAppendSQL(rider string) string {
	if rider == "" {
		return queuedAppendInsert + ` RETURNING position, global_position, time`
	}
	return `WITH appended AS (` + queuedAppendInsert + `
		RETURNING id, stream_name, type, position, global_position, time, data, metadata),
	rider AS (` + rider + `)
	SELECT position, global_position, time FROM appended`
}

// QueueAppend queues the appends of events on b, a pipeline inside a
// transaction: the category locks in a fixed order, then one conditional
// insert per event (appendOneSQL: each sees the earlier ones, so expected
// versions chain within the batch as in Append), with rider's statement
// (nil: none) in the same statement. Each raises when refused (or when its
// rider fails), so that nothing queued after a refusal runs, a COMMIT
// least of all. It returns the reader of their results. The
// transaction holds the category locks to commit. A refused event (a
// duplicate id, an expected version that does not hold) reads as
// pipeline.ErrRefused (run Append to learn which).
func QueueAppend(b *pgx.Batch, events []NewEvent, rider *Rider) (func(pgx.BatchResults) ([]Event, error), error) {
	prepared, err := prepare(events)
	if err != nil {
		return nil, err
	}
	categories := make([]string, 0, 1)
	for _, e := range prepared {
		categories = append(categories, Category(e.Stream))
	}
	slices.Sort(categories) // one lock order for everyone: no deadlocks
	categories = slices.Compact(categories)
	for _, c := range categories {
		b.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64($1))`, c)
	}
	sql := queuedPlainAppendSQL
	if rider != nil {
		sql = riderSQL(rider.SQL)
	}
	for i, e := range prepared {
		args := []any{e.ID, e.Stream, e.Type, jsonArg(e.Data), jsonArg(e.Metadata), expectedArg(e.ExpectedVersion)}
		if rider != nil {
			args = append(args, rider.Args(i)...)
		}
		b.Queue(sql, args...)
	}
	read := func(br pgx.BatchResults) ([]Event, error) {
		for range categories {
			if _, err := br.Exec(); err != nil {
				return nil, mapAppendError(err, prepared, -1)
			}
		}
		out := make([]Event, len(prepared))
		for i, e := range prepared {
			out[i] = Event{ID: e.ID, Stream: e.Stream, Type: e.Type, Data: e.Data, Metadata: e.Metadata}
			err := br.QueryRow().Scan(&out[i].Position, &out[i].GlobalPosition, &out[i].Time)
			if pipeline.Refused(err) {
				return nil, fmt.Errorf("event %d: stream %s: %w", i, e.Stream, pipeline.ErrRefused)
			}
			if err != nil {
				return nil, mapAppendError(err, prepared, i)
			}
			out[i].Time = out[i].Time.UTC()
		}
		return out, nil
	}
	return read, nil
}

var queuedPlainAppendSQL = queuedAppendSQL("")

// riders caches queuedAppendSQL by rider: a unit of work's riders are a
// few constants, and building the statement on every commit costs.
var riders sync.Map

func riderSQL(rider string) string {
	if s, ok := riders.Load(rider); ok {
		return s.(string)
	}
	s := queuedAppendSQL(rider)
	riders.Store(rider, s)
	return s
}
