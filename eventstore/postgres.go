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
	_ Store          = (*Postgres)(nil)
	_ BackwardReader = (*Postgres)(nil)
	_ Appender       = (*PostgresTx)(nil)
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

// ReadStreamBytes implements Store. The bound is applied in the database,
// which walks the stream an event at a time, summing sizes, and stops
// before the event that would pass it: neither the host nor the database
// reads the events past the page (a page of a stream of large events
// would otherwise cost the database the whole of limit's events).
func (p *Postgres) ReadStreamBytes(ctx context.Context, stream string, fromPosition int64, limit, maxBytes int) ([]Event, error) {
	if maxBytes <= 0 {
		return pgReadStream(ctx, p.pool, stream, fromPosition, limit)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validStream(stream); err != nil {
		return nil, err
	}
	// size is the length of data and metadata as read (jsonb's text
	// form), upto the page's running sum; the first event (n = 1) is in
	// the page however large.
	const size = `(coalesce(octet_length(data::text), 0) + coalesce(octet_length(metadata::text), 0))::bigint`
	return pgRead(ctx, p.pool, `WITH RECURSIVE page AS (
			(SELECT position, `+size+` AS upto, 1 AS n FROM message_store.messages
				WHERE stream_name = $1 AND position >= $2 ORDER BY position LIMIT 1)
			UNION ALL
			SELECT next.position, page.upto + next.size, page.n + 1 FROM page, LATERAL (
				SELECT position, `+size+` AS size FROM message_store.messages
				WHERE stream_name = $1 AND position > page.position ORDER BY position LIMIT 1) next
			WHERE page.n < $3 AND page.upto + next.size <= $4)
		SELECT `+eventColumns+` FROM message_store.messages
		WHERE stream_name = $1 AND position IN (SELECT position FROM page) ORDER BY position`,
		stream, fromPosition, limitOrDefault(limit), maxBytes)
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

// categoryBackwardSQL is ReadCategoryBackward's query
// (TestPostgresCategoryBackwardUsesTheCategoryIndex pins its plan).
const categoryBackwardSQL = `SELECT global_position, data FROM message_store.messages
	WHERE message_store.category(stream_name) = $1 AND global_position > $2 AND global_position <= $3
	ORDER BY global_position DESC LIMIT $4`

// ReadCategoryBackward implements BackwardReader. It is a backward index
// scan that stops at limit, as ReadCategory is a forward one: of
// MessageDB's messages_category index (category, global_position) for a
// rare category, of the primary key with a filter on the category for a
// common one, as the planner finds cheaper; never a sort of the category.
// Only global_position and data are selected.
func (p *Postgres) ReadCategoryBackward(ctx context.Context, category string, afterGlobal, toGlobal int64, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validCategory(category); err != nil {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, categoryBackwardSQL, category, afterGlobal, toGlobal, limitOrDefault(limit))
	if err != nil {
		return nil, readError(err)
	}
	out := []Event{}
	var (
		e    Event
		data []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&e.GlobalPosition, &data}, func() error {
		e.Data = slices.Clone(data)
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, readError(err)
	}
	return out, nil
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

// Rider is a statement that rides with the appends QueueAppend queues,
// inside the same SQL statement, so that it sees the appended rows without
// looking them up: a data-modifying statement without a RETURNING clause
// that reads the rows from the relation "appended" (columns id,
// stream_name, type, position, global_position, time, data, metadata, and
// ord: the event's place in the batch, from 1) and raises when it cannot
// do its part. Its parameters are numbered from $7; what differs per
// event goes in arrays read by subscript ($n[a.ord]), not by unnest, so
// that the rider's plan does not depend on how many events there are.
// The outbox's rows ride this way (outbox.Postgres.Rider).
type Rider struct {
	SQL  string
	Args []any
}

// queuedAppendSQL appends a batch of events in one statement, with the
// rider's statement, if any: the arrays $1 to $6 hold the events' ids,
// streams, types, data, metadata and expected versions (NULL: any). Each
// event goes at its stream's version plus one, the version counting the
// batch's earlier events of the stream, and is checked against its
// expected version at that point, as Append checks a batch. It raises when
// refused: a duplicate id violates messages_id, and an event whose stream
// is not at its expected version gets a NULL position, which violates its
// NOT NULL (the version is a value of the query, so the planner cannot
// fold the CASE into a constant NULL). The events are inserted in batch
// order (ORDER BY ord), so their global positions follow it, and the
// result returns them in that order.
func queuedAppendSQL(rider string) string {
	return `WITH ev AS (
		SELECT e.id::uuid AS id, e.stream, e.type, e.data::jsonb AS data, e.metadata::jsonb AS metadata, e.expected, e.ord
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])
			WITH ORDINALITY AS e(id, stream, type, data, metadata, expected, ord)),
	cur AS (
		SELECT s.stream, (SELECT coalesce(max(m.position), -1) FROM message_store.messages m WHERE m.stream_name = s.stream) AS version
		FROM (SELECT DISTINCT stream FROM ev) s),
	pos AS (
		SELECT ev.*, cur.version + row_number() OVER (PARTITION BY ev.stream ORDER BY ev.ord) - 1 AS before
		FROM ev JOIN cur ON cur.stream = ev.stream),
	inserted AS (
		INSERT INTO message_store.messages (id, stream_name, position, type, data, metadata)
		SELECT id, stream, CASE WHEN expected IS NULL OR expected = before THEN before + 1 END, type, data, metadata
		FROM pos ORDER BY ord
		RETURNING id, stream_name, type, position, global_position, time, data, metadata),
	appended AS (
		SELECT i.*, pos.ord FROM inserted i JOIN pos ON pos.id = i.id)` + withRider(rider) + `
	SELECT position, global_position, time FROM appended ORDER BY ord`
}

// queuedAppendOneSQL is queuedAppendSQL for a batch of one event, whose
// parameters $1 to $6 are scalars: appendOneSQL's insert, raising as
// queuedAppendSQL does. A unit of work of one event is the common case,
// and this costs about two thirds of the batch statement's time for it
// (no arrays to unnest, no window, no joins: 83 against 130 us in the
// server's log), and its plan does not depend on the arguments.
func queuedAppendOneSQL(rider string) string {
	return `WITH appended AS (
		INSERT INTO message_store.messages (id, stream_name, position, type, data, metadata)
		SELECT $1, $2, CASE WHEN $6::bigint IS NULL OR v.version = $6 THEN v.version + 1 END, $3, $4, $5
		FROM (SELECT coalesce(max(position), -1) AS version FROM message_store.messages WHERE stream_name = $2) v
		RETURNING id, stream_name, type, position, global_position, time, data, metadata, 1::bigint AS ord)` + withRider(rider) + `
	SELECT position, global_position, time FROM appended`
}

func withRider(rider string) string {
	if rider == "" {
		return ""
	}
	return `,
	rider AS (` + rider + `)`
}

// QueueAppend queues the appends of events on b, a pipeline inside a
// transaction: the category locks in a fixed order, then one statement
// for all the events (queuedAppendOneSQL for one, queuedAppendSQL for
// several: expected versions chain within the batch as in Append), with
// rider's statement (nil: none) in it. It raises
// when refused (or when its rider fails), so that nothing queued after a
// refusal runs, a COMMIT least of all. It returns the reader of its
// results. The transaction holds the category locks to commit. A refused
// event (a duplicate id, an expected version that does not hold) reads as
// pipeline.ErrRefused (run Append to learn which).
func QueueAppend(b *pgx.Batch, events []NewEvent, rider *Rider) (func(pgx.BatchResults) ([]Event, error), error) {
	prepared, err := prepare(events)
	if err != nil {
		return nil, err
	}
	n := len(prepared)
	categories := make([]string, 0, 1)
	for _, e := range prepared {
		categories = append(categories, Category(e.Stream))
	}
	slices.Sort(categories) // one lock order for everyone: no deadlocks
	categories = slices.Compact(categories)
	for _, c := range categories {
		b.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64($1))`, c)
	}
	var args []any
	if n == 1 {
		e := prepared[0]
		args = []any{e.ID, e.Stream, e.Type, jsonArg(e.Data), jsonArg(e.Metadata), expectedArg(e.ExpectedVersion)}
	} else {
		var (
			ids, streams, types = make([]string, n), make([]string, n), make([]string, n)
			data, metadata      = make([]*string, n), make([]*string, n)
			expected            = make([]*int64, n)
		)
		for i, e := range prepared {
			ids[i], streams[i], types[i] = e.ID, e.Stream, e.Type
			data[i], metadata[i] = textArg(e.Data), textArg(e.Metadata)
			if e.ExpectedVersion != AnyVersion {
				expected[i] = &prepared[i].ExpectedVersion
			}
		}
		args = []any{ids, streams, types, data, metadata, expected}
		// The arrays make every custom plan of the batch statement look
		// cheaper than the generic one (the planner knows how long they
		// are only in a custom plan), so the plan cache would plan it
		// afresh on every run (~1 ms).
		b.Queue(`SET LOCAL plan_cache_mode = force_generic_plan`)
	}
	riderSQL := ""
	if rider != nil {
		riderSQL = rider.SQL
		args = append(args, rider.Args...)
	}
	b.Queue(appendStatement(n == 1, riderSQL), args...)
	read := func(br pgx.BatchResults) ([]Event, error) {
		head := len(categories)
		if n > 1 {
			head++ // SET LOCAL
		}
		for range head {
			if _, err := br.Exec(); err != nil {
				return nil, mapAppendError(err, prepared, -1)
			}
		}
		rows, _ := br.Query()
		out := make([]Event, 0, n)
		var e Event
		_, err := pgx.ForEachRow(rows, []any{&e.Position, &e.GlobalPosition, &e.Time}, func() error {
			if len(out) == n {
				return fmt.Errorf("eventstore: append returned more than %d rows", n)
			}
			p := prepared[len(out)]
			out = append(out, Event{ID: p.ID, Stream: p.Stream, Type: p.Type, Data: p.Data, Metadata: p.Metadata,
				Position: e.Position, GlobalPosition: e.GlobalPosition, Time: e.Time.UTC()})
			return nil
		})
		if err != nil {
			if pipeline.Refused(err) {
				return nil, fmt.Errorf("eventstore: append %d events: %w", n, pipeline.ErrRefused)
			}
			return nil, mapAppendError(err, prepared, -1)
		}
		if len(out) != n {
			return nil, fmt.Errorf("eventstore: append %d events, appended %d: %w", n, len(out), pipeline.ErrRefused)
		}
		return out, nil
	}
	return read, nil
}

// textArg passes JSON as nullable text, for a text[] parameter.
func textArg(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// statements caches the append statements by form and rider: a unit of
// work's riders are a few constants, and building a statement on every
// commit costs.
var statements sync.Map

type statementKey struct {
	one   bool
	rider string
}

func appendStatement(one bool, rider string) string {
	k := statementKey{one, rider}
	if s, ok := statements.Load(k); ok {
		return s.(string)
	}
	s := queuedAppendSQL(rider)
	if one {
		s = queuedAppendOneSQL(rider)
	}
	statements.Store(k, s)
	return s
}
