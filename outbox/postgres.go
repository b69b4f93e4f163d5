package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/dbtime"
	"github.com/proteanhq/protean-host/internal/pgstore"
	"github.com/proteanhq/protean-host/internal/txdone"
)

// Postgres is a Store in the outbox table of a database migrated by package
// schema. It is safe for concurrent use, by many relays in many processes.
//
// Rows are added in the caller's transaction through [Postgres.Tx]. Add
// takes the same per-category advisory lock as the event store's append
// (MessageDB's), held to commit, so that within a category row IDs grow in
// commit order, which is what per-key ordering stands on. A unit of work
// that appended the events first already holds it.
//
// Claim is one statement (claimSQL): it walks the active-row index to the
// limit, locks its candidates with FOR UPDATE SKIP LOCKED, re-checks them
// under the lock, and leases them, so racing relays skip each other's rows
// instead of waiting or sharing them, and a claim racing a relay's mark
// never takes back a row just marked.
//
// A lease is the lock columns alone (locked_by, locked_until): the status
// column keeps pending or failed, and the store reports such a row as
// processing (statusSQL). The status is in the predicates of the partial
// indexes, so changing it made every claim insert an entry in each index;
// leaving it makes the claim a HOT update (migration 0007 leaves the room
// on the page). Marks and releases check the owner in locked_by. A row an
// older host left with status 'processing' is still processing, claimable
// once its lock expires, and markable by its owner.
//
// Time is the injected clock's, passed to every statement, never the
// database's now().
type Postgres struct {
	db pgstore.Store
	// highest is the highest row id a claim has returned: how far the
	// outbox has grown, for the claim's plan epoch (claimEpoch).
	highest atomic.Int64
	// wakes is the process's listener the relay wake-ups come over
	// (ListenOver); nil: a connection of ListenRelayWakes's own.
	wakes Subscriber
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a store on pool's database that reads time from now;
// nil means time.Now.
func NewPostgres(pool *pgxpool.Pool, now func() time.Time) *Postgres {
	return &Postgres{db: pgstore.New(pool, now)}
}

// Tx returns a view of the outbox inside tx, the caller's transaction: the
// rows it adds become claimable when tx commits.
func (p *Postgres) Tx(tx pgx.Tx) *PostgresTx { return &PostgresTx{db: p.db.In(tx)} }

// Add adds rows in a transaction of their own.
func (p *Postgres) Add(ctx context.Context, rows []Row) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, err := p.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("outbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := p.Tx(tx).Add(ctx, rows); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox: commit: %w", err)
	}
	return nil
}

// PostgresTx is the outbox inside a caller's pgx transaction. Like the
// pgx.Tx under it, it is for one goroutine at a time.
type PostgresTx struct{ db pgstore.Tx }

// Add checks and inserts rows, all or nothing: a failed Add leaves nothing
// behind, and the transaction stays usable. Add sets every field the store
// owns, whatever the caller put there.
//
// One row is inserted with ON CONFLICT DO NOTHING, so that a duplicate
// fails without an error in the database and needs no savepoint; several
// run under a savepoint. Either way it is one round trip.
func (t *PostgresTx) Add(ctx context.Context, rows []Row) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prepared, err := prepare(rows, t.db.Now())
	if err != nil {
		return err
	}
	if len(prepared) == 0 {
		return nil
	}
	single := len(prepared) == 1
	var b pgx.Batch
	if !single {
		b.Queue(`SAVEPOINT protean_outbox`)
	}
	var categories []string
	for _, r := range prepared {
		categories = append(categories, r.Category)
	}
	slices.Sort(categories) // one lock order for everyone: no deadlocks
	categories = slices.Compact(categories)
	for _, c := range categories {
		b.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64($1))`, c)
	}
	for _, r := range prepared {
		sql := insertSQL
		if single {
			sql += ` ON CONFLICT (message_id, target_broker) DO NOTHING`
		}
		b.Queue(sql, r.MessageID, r.Stream, r.Category, r.Type, jsonArg(r.Data), jsonArg(r.Metadata), r.CreatedAt,
			r.MaxRetries, r.PartitionKey, r.Priority, r.TargetBroker)
	}
	if !single {
		b.Queue(`RELEASE SAVEPOINT protean_outbox`)
	}

	err = readAdd(t.db.Tx.SendBatch(ctx, &b), prepared, len(categories), single)
	if err != nil && !single && !errors.Is(err, ErrTxDone) {
		if _, rbErr := t.db.Tx.Exec(ctx, `ROLLBACK TO SAVEPOINT protean_outbox; RELEASE SAVEPOINT protean_outbox`); rbErr != nil {
			return errors.Join(err, fmt.Errorf("outbox: roll back to savepoint: %w", rbErr))
		}
	}
	return err
}

// Appended is the outbox rows of events appended in the same
// transaction, one per event, in order: the rows' own fields. The rest
// (stream, category, type, data, and the metadata with the event's
// position, global_position and time) is the appended event's.
type Appended struct {
	// PartitionKeys and Priorities are each event's row's, by index.
	PartitionKeys []*string
	Priorities    []int
	// TargetBroker and MaxRetries are every row's (0: DefaultMaxRetries).
	TargetBroker string
	MaxRetries   int
}

// Rider returns a's rows as a rider of the appends of their events
// (eventstore.QueueAppend): the statement that appends the events inserts
// their rows too, built in the database from the appended rows as the
// unit of work builds them for Add (its outboxMetadata), so nothing of the
// payload crosses the network twice, no statement waits for the appends'
// answer, and the rows are never looked up. The rows' IDs follow the
// events' order. The category locks are the appends'. A duplicate raises
// (ErrDuplicate), failing the append's statement, so that a COMMIT queued
// after it never runs.
func (p *Postgres) Rider(a Appended) (*eventstore.Rider, error) {
	if len(a.PartitionKeys) != len(a.Priorities) {
		return nil, fmt.Errorf("outbox: %w: %d partition keys, %d priorities", ErrInvalid, len(a.PartitionKeys), len(a.Priorities))
	}
	for i, key := range a.PartitionKeys {
		r := Row{TargetBroker: a.TargetBroker, PartitionKey: key, MaxRetries: a.MaxRetries}
		if why := checkTarget(r); why != "" {
			return nil, fmt.Errorf("row %d (broker %s): %w: %s", i, a.TargetBroker, ErrInvalid, why)
		}
	}
	maxRetries := a.MaxRetries
	if maxRetries == 0 {
		maxRetries = DefaultMaxRetries
	}
	return &eventstore.Rider{SQL: riderSQL, Args: []any{p.db.Now(), maxRetries, a.TargetBroker, a.PartitionKeys, a.Priorities}}, nil
}

// riderSQL inserts the rows of the events in "appended", in their order,
// each with its key and priority from the arrays (subscripts, not unnest:
// the plan does not depend on how many there are, so the server's plan
// cache settles on one generic plan). The metadata is the unit of work's
// outboxMetadata, built here: the event's metadata (an object) with its
// position, global_position and time (timeJSON).
var riderSQL = `INSERT INTO outbox (message_id, stream_name, category, type, data, metadata, created_at,
		max_retries, partition_key, priority, target_broker, correlation_id, causation_id)
	SELECT a.id::text, a.stream_name, message_store.category(a.stream_name), a.type, a.data, x.md,
		$7::timestamptz, $8::int, ($10::text[])[a.ord], ($11::int[])[a.ord], $9::text,
		left(x.md->>'correlation_id', 255), left(x.md->>'causation_id', 255)
	FROM appended a CROSS JOIN LATERAL (SELECT
		CASE WHEN jsonb_typeof(a.metadata) = 'object' THEN a.metadata ELSE '{}'::jsonb END
		|| jsonb_build_object('position', a.position, 'global_position', a.global_position,
			'time', ` + timeJSON("a.time") + `) AS md) x
	ORDER BY a.ord`

// timeJSON is the text of a timestamp (without time zone, in UTC: the
// event store's) as encoding/json writes a UTC time.Time: RFC 3339 with
// the fraction's trailing zeros dropped, and Z. Readers decode it into a
// time.Time (the relay's fillPositions, internal/relay), which needs the Z.
func timeJSON(column string) string {
	return `rtrim(rtrim(to_char(` + column + `, 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'), '.') || 'Z'`
}

const insertSQL = `INSERT INTO outbox (message_id, stream_name, category, type, data, metadata, created_at,
		max_retries, partition_key, priority, target_broker, correlation_id, causation_id)
	VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11,
		left($6::jsonb->>'correlation_id', 255), left($6::jsonb->>'causation_id', 255))`

// readAdd reads the batch Add queued and closes it.
func readAdd(br pgx.BatchResults, prepared []Row, locks int, single bool) (err error) {
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = mapAddError(cerr, nil)
		}
	}()
	head := locks
	if !single {
		head++
	}
	for range head {
		if _, err := br.Exec(); err != nil {
			return mapAddError(err, nil)
		}
	}
	for i := range prepared {
		tag, err := br.Exec()
		if err != nil {
			return mapAddError(err, &prepared[i])
		}
		if tag.RowsAffected() == 0 { // ON CONFLICT DO NOTHING
			return fmt.Errorf("outbox: message %s for broker %s: %w", prepared[i].MessageID, prepared[i].TargetBroker, ErrDuplicate)
		}
	}
	if !single {
		if _, err := br.Exec(); err != nil {
			return mapAddError(err, nil)
		}
	}
	return nil
}

func mapAddError(err error, r *Row) error {
	if txdone.Closed(err) {
		return ErrTxDone
	}
	what := "outbox: add"
	if r != nil {
		what = fmt.Sprintf("outbox: message %s for broker %s", r.MessageID, r.TargetBroker)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505": // unique_violation: (message_id, target_broker)
			return fmt.Errorf("%s: %w", what, ErrDuplicate)
		case "22001", "22021": // too long for its column; not valid UTF-8
			return fmt.Errorf("%s: %w: %s", what, ErrInvalid, pgErr.Message)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// statusSQL is a row's status as the Store reports it. A claim leaves the
// status column alone (see claimSQL), so a pending or failed row under a
// claim's lock (locked_by set) is processing; a row an older host left
// with status 'processing' is processing too.
const statusSQL = `CASE WHEN locked_by IS NOT NULL AND status IN ('pending', 'failed') THEN 'processing' ELSE status END`

// activeSQL is the WHERE of a row a claim may have leased: active in the
// indexes' terms. A mark or release applies to such a row only under its
// owner's lock (locked_by).
const activeSQL = `status IN ('pending', 'failed', 'processing')`

// rowColumns are the columns scanRow reads, in order.
const rowColumns = `id, message_id, stream_name, category, type, data, metadata, partition_key, priority,
	target_broker, ` + statusSQL + `, retry_count, max_retries, next_retry_at, locked_until, coalesce(locked_by, ''),
	coalesce(last_error->>'message', ''), created_at, published_at`

func scanRow(row pgx.Row) (Row, error) {
	var (
		r          Row
		data, meta []byte
		status     string
	)
	err := row.Scan(&r.ID, &r.MessageID, &r.Stream, &r.Category, &r.Type, &data, &meta, &r.PartitionKey, &r.Priority,
		&r.TargetBroker, &status, &r.RetryCount, &r.MaxRetries, &r.NextRetryAt, &r.LockedUntil, &r.LockedBy,
		&r.LastError, &r.CreatedAt, &r.PublishedAt)
	if err != nil {
		return Row{}, err
	}
	r.Status = Status(status)
	if data != nil {
		r.Data = append([]byte(nil), data...)
	}
	if meta != nil {
		r.Metadata = append([]byte(nil), meta...)
	}
	r.CreatedAt = r.CreatedAt.UTC()
	for _, t := range []*time.Time{r.NextRetryAt, r.LockedUntil, r.PublishedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return r, nil
}

// eligibleSQL is a row's own claimability at $2 (now): retries left, not
// waiting for its retry time, not under another claim's live lock. A
// claimed row keeps its status (pending or failed) and carries the lock
// in locked_until; a row an older host claimed is 'processing' with its
// lock, and one without locked_until never was claimed.
const eligibleSQL = `(%[1]s.retry_count < %[1]s.max_retries
	AND (%[1]s.status <> 'failed' OR %[1]s.next_retry_at IS NULL OR %[1]s.next_retry_at <= $2)
	AND coalesce(%[1]s.locked_until <= $2, %[1]s.status <> 'processing'))`

// claimSQL leases the claimable rows of a broker in one statement, without
// a transaction of its own.
//
// candidates walks the broker's active rows in claim order (priority, then
// id) on the outbox_active index and stops at the limit, so a claim costs
// the rows it hands out, not the backlog. A row is a candidate if it is
// eligible and the first active row of its ordering key before it (probed
// on outbox_ordering) can be claimed too: a key's rows wait while its head
// is under another claim's lock, waiting for its retry, or halted. The
// probe reads one row of the key, not every earlier one: a row's run
// blocks only at the head of its key (a claim takes a prefix of the key's
// active rows, and a row fails or halts only as the first of its key in a
// pass), and where that does not hold the check below drops the candidate,
// so the probe only keeps the walk's limit for rows that can go. FOR UPDATE
// SKIP LOCKED locks the candidates and skips rows another claim or a mark
// holds; a candidate changed since the statement's snapshot is re-checked
// on its newest version (READ COMMITTED re-evaluates the WHERE of a
// locking read), so a row a relay has just marked published or abandoned,
// or failed with a retry time ahead, is not taken back.
//
// The snapshot that chose the candidates may be stale for the rows before
// them, so the UPDATE keeps a candidate only if every earlier active row of
// its key is a candidate too: those are locked by this statement and
// re-checked, and any other earlier row (skipped because locked, changed,
// or beyond the walk) holds its key back until a later claim. runs finds,
// once per key of the claim (not per candidate), the key's first active row
// that is not a candidate, before its last candidate; the candidates from
// there on stay. That keeps per-key order without serialising claims:
// racing claims skip each other's rows and never hold rows of one key at
// once. A per-candidate probe of every earlier row, as the claim had before,
// read each key's run and the dead index entries of its rows published in
// the drain once per candidate, and a productive claim and mark of 50 rows
// on 6 keys cost 30 ms instead of 12 (BenchmarkClaimPostgresHeld, internal/relay).
//
// The UPDATE sets only the lock columns, so that it is a HOT update (see
// Postgres), and must cost the candidates too, not the backlog: its probes
// are correlated subqueries on outbox_ordering (runs is MATERIALIZED, so
// that its probe runs once per key, not once per candidate of the join),
// and it finds its rows through the primary key
// (id = ANY(ARRAY(…)), not a join the planner may run as a sequential
// scan). With a 5,000-row backlog the statement went from 8.6 ms to 2.4 ms
// per 50 rows; leaving the status alone (a HOT update) and the generic
// plan (claimQuery) took it to about 0.6 ms at 20,000.
//
// The probes' range is the row comparison (ordering_key, id) < (…), not
// id < …: with an equal ordering_key it means the same, but it is a range
// of outbox_ordering (key, then id) and of no other index, so the plan does
// not rest on statistics. With id < … the planner often chose the primary
// key, which walks every earlier row of the outbox, published ones too, and
// a claim grew from about 1 ms to 100 ms as a backlog drained (migration
// 0012; TestClaimPlanWalksIndexes).
//
// The walk runs only if some row can be claimed at all, which headsSQL
// tells from the keys' first rows.
//
// claimSQL is a format string for its limit (claimQuery).
var claimSQL = `WITH candidates AS (
	SELECT c.id, c.category, c.ordering_key, c.partition_key IS NOT NULL AS keyed,
		CASE WHEN c.partition_key IS NULL THEN c.priority ELSE 0 END AS lane
	FROM outbox c
	WHERE ` + headsSQL + ` AND c.target_broker = $1 AND c.status IN ('pending', 'failed', 'processing')
		AND ` + fmt.Sprintf(eligibleSQL, "c") + `
		AND NOT EXISTS (SELECT 1 FROM (SELECT e.* FROM outbox e
				WHERE e.target_broker = $1 AND e.category = c.category AND e.ordering_key = c.ordering_key
					AND (e.ordering_key, e.id) < (c.ordering_key, c.id) AND e.status IN ('pending', 'failed', 'processing', 'halted')
					AND (c.partition_key IS NOT NULL OR e.priority = c.priority)
				ORDER BY e.ordering_key, e.id LIMIT 1) e
			WHERE e.status = 'halted' OR NOT ` + fmt.Sprintf(eligibleSQL, "e") + `)
	ORDER BY c.priority DESC, c.id
	LIMIT %d
	FOR UPDATE OF c SKIP LOCKED
), runs AS MATERIALIZED (
	SELECT g.category, g.ordering_key, g.keyed, g.lane, (SELECT e.id FROM outbox e
			WHERE e.target_broker = $1 AND e.category = g.category AND e.ordering_key = g.ordering_key
				AND (e.ordering_key, e.id) < (g.ordering_key, g.last) AND e.status IN ('pending', 'failed', 'processing', 'halted')
				AND (g.keyed OR e.priority = g.lane) AND e.id NOT IN (SELECT id FROM candidates)
			ORDER BY e.ordering_key, e.id LIMIT 1) AS gap
	FROM (SELECT category, ordering_key, keyed, lane, max(id) AS last FROM candidates GROUP BY 1, 2, 3, 4) g
)
UPDATE outbox o SET locked_by = $3, locked_until = $4, last_processed_at = $2
WHERE o.id = ANY(ARRAY(SELECT k.id FROM candidates k JOIN runs r
	ON (r.category, r.ordering_key, r.keyed, r.lane) = (k.category, k.ordering_key, k.keyed, k.lane)
	WHERE r.gap IS NULL OR k.id < r.gap))
RETURNING ` + `o.id, o.message_id, o.stream_name, o.category, o.type, o.data, o.metadata, o.partition_key, o.priority,
	o.target_broker, 'processing', o.retry_count, o.max_retries, o.next_retry_at, o.locked_until, coalesce(o.locked_by, ''),
	coalesce(o.last_error->>'message', ''), o.created_at, o.published_at%s`

// headsSQL gates the claim's walk: it is true unless every key with
// active rows has a first row (in id order) that cannot be claimed (under
// another claim's lock, waiting for its retry, out of retries, halted), in
// which case no row of the broker can be claimed and the walk would only
// visit the backlog behind those keys, each row with its probe: 40 ms for
// 7,000 rows on 6 keys, paid by every relay whose claim comes while
// another relay holds the keys' heads (a backlog after an outage), and by
// every claim while a halted key holds back a backlog. It steps through
// the keys on outbox_ordering, one probe per key for the next key and one
// for its first row, and stops at the first key whose first row can be
// claimed. A first row without a partition key counts as claimable (its
// key's order is per priority, which the first row alone does not tell),
// and so does reaching the 65th key: the gate costs at most 65 keys, and
// past that the walk runs as it did without it. The first row is found as
// a range of outbox_ordering, (ordering_key, id) > (key, 0), so that the
// plan never takes it from the primary key, which walks every row of the
// outbox in id order (TestClaimPlanWalksIndexes). It is a scalar subquery
// that refers to no row of the walk, so the plan evaluates it once, as a
// one-time filter, before the walk starts.
var headsSQL = `(WITH RECURSIVE heads AS (
		(SELECT h.category, h.ordering_key, 1 AS n FROM outbox h
			WHERE h.target_broker = $1 AND h.status IN ('pending', 'failed', 'processing', 'halted')
			ORDER BY h.category, h.ordering_key LIMIT 1)
		UNION ALL
		SELECT x.category, x.ordering_key, k.n + 1 FROM heads k CROSS JOIN LATERAL (SELECT h.category, h.ordering_key FROM outbox h
			WHERE h.target_broker = $1 AND h.status IN ('pending', 'failed', 'processing', 'halted')
				AND (h.category, h.ordering_key) > (k.category, k.ordering_key)
			ORDER BY h.category, h.ordering_key LIMIT 1) x
		WHERE k.n < 65)
	SELECT EXISTS (SELECT 1 FROM heads k CROSS JOIN LATERAL (SELECT h.* FROM outbox h
			WHERE h.target_broker = $1 AND h.category = k.category AND h.ordering_key = k.ordering_key
				AND (h.ordering_key, h.id) > (k.ordering_key, 0) AND h.status IN ('pending', 'failed', 'processing', 'halted')
			ORDER BY h.ordering_key, h.id LIMIT 1) h
		WHERE k.n = 65 OR h.partition_key IS NULL
			OR (h.status <> 'halted' AND ` + fmt.Sprintf(eligibleSQL, "h") + `)))`

// prevColumn is ClaimChained's extra column, Row.Prev: for a row with a
// key, the newest published row of the key before it on the same stream
// ($5 lanes on, $6 threshold), found on outbox_published_key. Its range is
// the row comparison (ordering_key, id) < (…), as in claimSQL, for the same
// reason: with p.id < o.id and ORDER BY p.id the planner took the primary
// key backwards on an outbox of a few keys, which walks every published row
// of the other keys back to the key's last one.
const prevColumn = `, CASE WHEN o.partition_key IS NULL THEN 0 ELSE coalesce((SELECT (p.metadata->>'global_position')::bigint
		FROM outbox p
		WHERE p.target_broker = o.target_broker AND p.category = o.category AND p.ordering_key = o.ordering_key
			AND p.status = 'published' AND (p.ordering_key, p.id) < (o.ordering_key, o.id)
			AND (NOT $5::bool OR (p.priority < $6::int) = (o.priority < $6::int))
			AND (p.metadata->>'global_position') ~ '^[0-9]+$'
		ORDER BY p.ordering_key DESC, p.id DESC LIMIT 1), 0) END`

// claimQuery is claimSQL with its limit, for the outbox's plan epoch. The
// limit is in the text, not a parameter, so that the server's plan cache
// settles on the generic plan after five runs: with LIMIT $n the generic
// plan's estimate (a tenth of the active rows) looked dearer than a
// custom one, and every claim was planned afresh, about 1 ms, as long as
// the statement itself.
//
// The epoch is in the text too, as a comment: a new epoch is a new
// statement on each connection, planned afresh for the outbox as it is
// then (claimEpoch).
func claimQuery(limit int, chained bool, epoch int) string {
	extra := ""
	if chained {
		extra = prevColumn
	}
	return fmt.Sprintf("/* plan epoch %d */ ", epoch) + fmt.Sprintf(claimSQL, limit, extra)
}

// claimEpoch is the claim's plan epoch once the outbox has held rows up
// to id highest: one more each time it grows four times over (from ids
// 2, 8, 32, ... 2^(2k-1)), about fifteen in a deployment's life.
//
// A connection plans a statement once and keeps the plan (the generic
// plan, see claimQuery) until the table's statistics change. A relay's
// first claims on a fresh deployment meet an outbox that is empty or
// small and not analyzed yet, and their plan is right for it (a
// sequential scan to find a claim's rows, a walk of the few published
// rows for each row's Prev); kept while the outbox grew with the rows it
// publishes, until autovacuum's first analyze, it cost 10-12 ms a claim
// instead of 0.5-1 (make load, 1 host, the first minute: 72-76 % of
// PostgreSQL's execution time). A new epoch is planned for the outbox's
// size then, analyzed or not.
func claimEpoch(highest int64) int {
	return bits.Len64(uint64(max(highest, 0))) / 2
}

// Claim implements Store.
func (p *Postgres) Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]Row, error) {
	return p.claim(ctx, broker, owner, limit, lockFor, nil)
}

// ClaimChained implements Chainer: the claim's one statement returns each
// row's Prev too.
func (p *Postgres) ClaimChained(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes Lanes) ([]Row, error) {
	return p.claim(ctx, broker, owner, limit, lockFor, &lanes)
}

func (p *Postgres) claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes *Lanes) ([]Row, error) {
	sql, args, err := p.claimStatement(ctx, broker, owner, limit, lockFor, lanes)
	if err != nil {
		return nil, err
	}
	rows, err := p.db.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return p.claimed(rows, lanes)
}

// claimStatement is the claim's statement and its arguments.
func (p *Postgres) claimStatement(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes *Lanes) (string, []any, error) {
	limit, lockFor, err := claimArgs(ctx, broker, owner, limit, lockFor)
	if err != nil {
		return "", nil, err
	}
	now := p.db.Clock()
	args := []any{broker, now, owner, now.Add(lockFor)}
	if lanes != nil {
		args = append(args, lanes.Enabled, lanes.Threshold)
	}
	return claimQuery(limit, lanes != nil, claimEpoch(p.highest.Load())), args, nil
}

// claimed reads the claim's rows, in claim order.
func (p *Postgres) claimed(rows pgx.Rows, lanes *Lanes) ([]Row, error) {
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		if lanes == nil {
			return scanRow(r)
		}
		var prev int64
		row, err := scanRow(extraColumn{r, &prev})
		row.Prev = prev
		return row, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	for _, r := range out {
		if r.ID > p.highest.Load() {
			p.highest.Store(r.ID) // racing claims: a lower one may win, the next claim corrects it
		}
	}
	claimOrder(out)
	return out, nil
}

// extraColumn scans a row whose last column is one more than scanRow reads.
type extraColumn struct {
	pgx.Row
	extra any
}

func (r extraColumn) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.extra)...) }

// MarkPublished implements Store.
func (p *Postgres) MarkPublished(ctx context.Context, id int64, owner string) error {
	return p.markOwned(ctx, id, owner, `UPDATE outbox SET status = 'published', published_at = $3,
		next_retry_at = NULL, locked_by = NULL, locked_until = NULL, last_processed_at = $3
		WHERE id = $1 AND `+activeSQL+` AND locked_by = $2`, p.db.Now())
}

// markPublishedSQL marks the rows of ids ($1) that owner ($2) holds
// published at $3, and returns their ids.
const markPublishedSQL = `UPDATE outbox SET status = 'published', published_at = $3,
		next_retry_at = NULL, locked_by = NULL, locked_until = NULL, last_processed_at = $3
		WHERE id = ANY($1) AND ` + activeSQL + ` AND locked_by = $2 RETURNING id`

// MarkPublishedBatch implements Store.
func (p *Postgres) MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error {
	return p.batchOwned(ctx, "mark published", owner, ids, markPublishedSQL)
}

// MarkAndClaim implements MarkingClaimer: the mark and the claim in one
// pipeline, one implicit transaction (a failure of either undoes both).
func (p *Postgres) MarkAndClaim(ctx context.Context, owner string, ids []int64, broker string, limit int, lockFor time.Duration, lanes *Lanes) (_ []Row, markErr, _ error) {
	if len(ids) == 0 {
		rows, err := p.claim(ctx, broker, owner, limit, lockFor, lanes)
		return rows, nil, err
	}
	sql, args, err := p.claimStatement(ctx, broker, owner, limit, lockFor, lanes)
	if err != nil {
		return nil, nil, err
	}
	var b pgx.Batch
	b.Queue(markPublishedSQL, ids, owner, p.db.Now())
	b.Queue(sql, args...)
	br := p.db.Pool.SendBatch(ctx, &b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: mark published: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: mark published: %w", err)
	}
	markErr = notOwned("mark published", ids, done)
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	claimed, err := p.claimed(rows, lanes)
	if err != nil {
		return nil, nil, err
	}
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("outbox: mark published and claim: %w", err)
	}
	return claimed, markErr, nil
}

// Release implements Store.
func (p *Postgres) Release(ctx context.Context, owner string, ids []int64) error {
	return p.batchOwned(ctx, "release", owner, ids, `UPDATE outbox SET status = 'pending',
		next_retry_at = NULL, locked_by = NULL, locked_until = NULL, last_processed_at = $3
		WHERE id = ANY($1) AND `+activeSQL+` AND locked_by = $2 RETURNING id`)
}

// batchOwned runs an update of the rows of ids owner holds, and names the
// ones it did not change.
func (p *Postgres) batchOwned(ctx context.Context, op, owner string, ids []int64, sql string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := p.db.Pool.Query(ctx, sql, ids, owner, p.db.Now())
	if err != nil {
		return fmt.Errorf("outbox: %s: %w", op, err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("outbox: %s: %w", op, err)
	}
	return notOwned(op, ids, done)
}

// notOwned is nil when an update of ids owned by the caller changed every
// one of them (done), else an error wrapping ErrNotOwner that names the
// others.
func notOwned(op string, ids, done []int64) error {
	if len(done) == len(ids) {
		return nil
	}
	hit := make(map[int64]bool, len(done))
	for _, id := range done {
		hit[id] = true
	}
	var missed []int64
	for _, id := range ids {
		if !hit[id] {
			missed = append(missed, id)
		}
	}
	return fmt.Errorf("%s: outbox rows %v: %w", op, missed, ErrNotOwner)
}

// MarkFailed implements Store.
func (p *Postgres) MarkFailed(ctx context.Context, id int64, owner, errMsg string, nextRetryAt time.Time) error {
	return p.markOwned(ctx, id, owner, `UPDATE outbox SET
		retry_count = retry_count + 1,
		status = CASE WHEN retry_count + 1 < max_retries THEN 'failed'
			WHEN partition_key IS NULL THEN 'abandoned' ELSE 'halted' END,
		next_retry_at = CASE WHEN retry_count + 1 >= max_retries THEN NULL ELSE $4::timestamptz END,
		last_error = jsonb_build_object('message', $5::text, 'failed_at', $3::timestamptz, 'retry_count', retry_count + 1)
			|| CASE WHEN retry_count + 1 >= max_retries THEN '{"reason": "Max retries exceeded"}'::jsonb ELSE '{}'::jsonb END,
		locked_by = NULL, locked_until = NULL, last_processed_at = $3
		WHERE id = $1 AND `+activeSQL+` AND locked_by = $2`,
		p.db.Now(), dbtime.Of(nextRetryAt), errMsg)
}

// markOwned runs a mark that applies only under owner's lock, and explains
// a miss.
func (p *Postgres) markOwned(ctx context.Context, id int64, owner, sql string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := p.db.Pool.Exec(ctx, sql, append([]any{id, owner}, args...)...)
	if err != nil {
		return fmt.Errorf("outbox row %d: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	status, lockedBy, err := p.state(ctx, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("outbox row %d: %s, locked by %q, not %q: %w", id, status, lockedBy, owner, ErrNotOwner)
}

// state reads a row's status and lock owner, or ErrNotFound.
func (p *Postgres) state(ctx context.Context, id int64) (Status, string, error) {
	var status, lockedBy string
	err := p.db.Pool.QueryRow(ctx, `SELECT `+statusSQL+`, coalesce(locked_by, '') FROM outbox WHERE id = $1`, id).Scan(&status, &lockedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("outbox row %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return "", "", fmt.Errorf("outbox row %d: %w", id, err)
	}
	return Status(status), lockedBy, nil
}

// Abandon implements Store.
func (p *Postgres) Abandon(ctx context.Context, id int64, reason string) error {
	return p.transition(ctx, id, "abandon", `UPDATE outbox SET status = 'abandoned',
		last_error = jsonb_build_object('message', $2::text, 'reason', $2::text, 'failed_at', $3::timestamptz, 'retry_count', retry_count),
		next_retry_at = NULL, locked_until = NULL, locked_by = NULL
		WHERE id = $1 AND status <> 'published'`, reason, p.db.Now())
}

// Retry implements Store.
func (p *Postgres) Retry(ctx context.Context, id int64) error {
	var passed int64
	err := p.db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT l.id FROM outbox o JOIN outbox l ON l.target_broker = o.target_broker
		AND l.category = o.category AND l.ordering_key = o.ordering_key AND l.id > o.id
		WHERE o.id = $1 AND o.status = 'abandoned' AND o.partition_key IS NOT NULL AND l.status = 'published'
		ORDER BY l.id LIMIT 1), 0)`, id).Scan(&passed)
	if err != nil {
		return fmt.Errorf("outbox row %d: %w", id, err)
	}
	if passed > 0 {
		return fmt.Errorf("outbox row %d: row %d of its key was published after it: %w", id, passed, ErrPassed)
	}
	return p.transition(ctx, id, "retry", `UPDATE outbox SET status = 'pending', retry_count = 0,
		next_retry_at = NULL, locked_until = NULL, locked_by = NULL
		WHERE id = $1 AND (status IN ('abandoned', 'halted') OR status = 'failed' AND locked_by IS NULL)`)
}

// transition runs an operator's UPDATE of row id ($1), whose WHERE admits
// only the statuses op allows, and explains a miss: ErrNotFound, or
// ErrStatus naming the row's status.
func (p *Postgres) transition(ctx context.Context, id int64, op, sql string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := p.db.Pool.Exec(ctx, sql, append([]any{id}, args...)...)
	if err != nil {
		return fmt.Errorf("outbox row %d: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	status, _, err := p.state(ctx, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("outbox row %d: %s a %s row: %w", id, op, status, ErrStatus)
}

// Cleanup implements Store.
func (p *Postgres) Cleanup(ctx context.Context, publishedBefore, abandonedBefore time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := p.db.Pool.Exec(ctx, `DELETE FROM outbox
		WHERE (status = 'published' AND published_at < $1) OR (status = 'abandoned' AND created_at < $2)`,
		publishedBefore, abandonedBefore)
	if err != nil {
		return 0, fmt.Errorf("outbox: cleanup: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Stats implements Store. Its three reads run in one round trip.
func (p *Postgres) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	var b pgx.Batch
	b.Queue(`SELECT ` + statusSQL + `, count(*) FROM outbox GROUP BY 1`)
	b.Queue(`SELECT min(created_at) FROM outbox WHERE status = 'pending' AND locked_by IS NULL`)
	b.Queue(`SELECT id, status, category, coalesce(partition_key, ''), message_id, target_broker, retry_count,
		coalesce(last_error->>'message', ''), created_at
		FROM outbox WHERE status IN ('abandoned', 'halted') ORDER BY id LIMIT $1`, maxStatsAbandoned)
	b.Queue(`SELECT target_broker, owner, expires_at FROM outbox_relay_leases ORDER BY target_broker`)
	br := p.db.Pool.SendBatch(ctx, &b)
	s, err := readStats(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	return s, nil
}

func readStats(br pgx.BatchResults) (Stats, error) {
	s := Stats{Counts: make(map[Status]int, len(statuses))}
	for _, st := range statuses {
		s.Counts[st] = 0
	}
	rows, err := br.Query()
	if err != nil {
		return Stats{}, err
	}
	var (
		status string
		n      int
	)
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		s.Counts[Status(status)] = n
		return nil
	}); err != nil {
		return Stats{}, err
	}
	if err := br.QueryRow().Scan(&s.OldestPending); err != nil {
		return Stats{}, err
	}
	if s.OldestPending != nil {
		*s.OldestPending = s.OldestPending.UTC()
	}
	rows, err = br.Query()
	if err != nil {
		return Stats{}, err
	}
	var a Abandoned
	if _, err := pgx.ForEachRow(rows, []any{&a.ID, &a.Status, &a.Category, &a.Key, &a.MessageID, &a.TargetBroker, &a.RetryCount,
		&a.LastError, &a.CreatedAt}, func() error {
		a.CreatedAt = a.CreatedAt.UTC()
		s.Abandoned = append(s.Abandoned, a)
		return nil
	}); err != nil {
		return Stats{}, err
	}
	rows, err = br.Query()
	if err != nil {
		return Stats{}, err
	}
	var l RelayLease
	if _, err := pgx.ForEachRow(rows, []any{&l.Broker, &l.Owner, &l.Expires}, func() error {
		l.Expires = l.Expires.UTC()
		s.RelayLeases = append(s.RelayLeases, l)
		return nil
	}); err != nil {
		return Stats{}, err
	}
	return s, nil
}

// Get implements Store.
func (p *Postgres) Get(ctx context.Context, id int64) (Row, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, err
	}
	r, err := scanRow(p.db.Pool.QueryRow(ctx, `SELECT `+rowColumns+` FROM outbox WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("outbox row %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox row %d: %w", id, err)
	}
	return r, nil
}

// jsonArg passes JSON to a jsonb parameter; nil is SQL NULL.
func jsonArg(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// LastPublished implements Republisher.
func (p *Postgres) LastPublished(ctx context.Context, broker string) (time.Time, error) {
	var last *time.Time
	if err := p.db.Pool.QueryRow(ctx, `SELECT max(published_at) FROM outbox WHERE target_broker = $1 AND status = 'published'`,
		broker).Scan(&last); err != nil {
		return time.Time{}, fmt.Errorf("outbox: last published: %w", err)
	}
	if last == nil {
		return time.Time{}, nil
	}
	return last.UTC(), nil
}

// republishSQL makes the broker's rows published since $2 pending again,
// except those Keep.applied keeps: a row with a partition key whose
// category has appliers ($3, $4, $5: category, group, unit prefix) all of
// whose consumer positions of its unit, on its stream (Lanes.Stream: $6,
// $7, $8), are at or past its global position, and no other group's
// position of the unit {category}:{key} on that stream is behind it.
const republishSQL = `UPDATE outbox o SET status = 'pending', published_at = NULL, retry_count = 0,
		next_retry_at = NULL, locked_by = NULL, locked_until = NULL
	WHERE o.target_broker = $1 AND o.status = 'published' AND o.published_at >= $2
	AND NOT (o.partition_key IS NOT NULL AND o.category = ANY($3::text[])
		AND (o.metadata->>'global_position') ~ '^[0-9]+$'
		AND NOT EXISTS (
			SELECT 1 FROM unnest($3::text[], $4::text[], $5::text[]) AS a(category, grp, prefix)
			WHERE a.category = o.category AND NOT EXISTS (
				SELECT 1 FROM consumer_positions cp
				WHERE cp.consumer_group = a.grp AND cp.unit = a.prefix || ':' || o.partition_key
				AND (cp.positions->>(CASE WHEN $6::bool AND o.priority < $7::int
					THEN o.category || ':' || o.partition_key || ':' || $8::text
					ELSE o.category || ':' || o.partition_key END))::bigint
					>= (o.metadata->>'global_position')::bigint))
		AND NOT EXISTS (
			SELECT 1 FROM consumer_positions cp
			WHERE cp.unit = o.category || ':' || o.partition_key
			AND (cp.positions->>(CASE WHEN $6::bool AND o.priority < $7::int
				THEN o.category || ':' || o.partition_key || ':' || $8::text
				ELSE o.category || ':' || o.partition_key END))::bigint
				< (o.metadata->>'global_position')::bigint))`

// Republish implements Republisher: one transaction under an advisory lock
// per broker, so relays that meet the lost marker at once republish once.
func (p *Postgres) Republish(ctx context.Context, broker, epoch string, since time.Time, keep Keep,
	stillLost func(context.Context) (bool, error)) (int, bool, error) {
	tx, err := p.db.Pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: republish: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('protean broker epoch ' || $1))`, broker); err != nil {
		return 0, false, fmt.Errorf("outbox: republish: lock: %w", err)
	}
	if lost, err := stillLost(ctx); err != nil || !lost {
		return 0, false, err
	}
	var prev string
	err = tx.QueryRow(ctx, `SELECT epoch FROM broker_epochs WHERE broker = $1`, broker).Scan(&prev)
	first := errors.Is(err, pgx.ErrNoRows)
	if err != nil && !first {
		return 0, false, fmt.Errorf("outbox: republish: %w", err)
	}
	n := 0
	if !first {
		categories, groups, prefixes := keep.columns()
		tag, err := tx.Exec(ctx, republishSQL, broker, dbtime.Of(since), categories, groups, prefixes,
			keep.Lanes.Enabled, keep.Lanes.Threshold, keep.Lanes.Suffix)
		if err != nil {
			return 0, false, fmt.Errorf("outbox: republish: %w", err)
		}
		n = int(tag.RowsAffected())
	}
	// Revoke every claim: a relay that published a row into the lost Redis
	// and has not marked it yet must not mark it now (it is in no stream),
	// nor publish the rest of its run ahead of the rows made pending here.
	if _, err := tx.Exec(ctx, `UPDATE outbox SET locked_by = NULL, locked_until = NULL,
		status = CASE WHEN status = 'processing' THEN 'pending' ELSE status END
		WHERE target_broker = $1 AND status IN ('pending', 'failed', 'processing') AND locked_by IS NOT NULL`, broker); err != nil {
		return 0, false, fmt.Errorf("outbox: republish: revoke claims: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO broker_epochs (broker, epoch, marked_at) VALUES ($1, $2, $3)
		ON CONFLICT (broker) DO UPDATE SET epoch = excluded.epoch, marked_at = excluded.marked_at`,
		broker, epoch, p.db.Now()); err != nil {
		return 0, false, fmt.Errorf("outbox: republish: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("outbox: republish: %w", err)
	}
	return n, first, nil
}
