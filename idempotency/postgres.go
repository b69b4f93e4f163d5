package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a Store in the idempotency_keys table of a database migrated
// by package schema. It is safe for concurrent use, by many hosts.
type Postgres struct {
	pool *pgxpool.Pool
	ttl  time.Duration
	now  func() time.Time
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a store on pool's database that keeps answers for
// ttl (DefaultTTL if <= 0), reading time from now (nil: time.Now).
func NewPostgres(pool *pgxpool.Pool, ttl time.Duration, now func() time.Time) *Postgres {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if now == nil {
		now = time.Now
	}
	return &Postgres{pool: pool, ttl: ttl, now: now}
}

func (p *Postgres) clock() time.Time { return p.now().UTC().Truncate(time.Microsecond) }

// TTL is how long the store keeps a key.
func (p *Postgres) TTL() time.Duration { return p.ttl }

// Lease is how long a request holds its key before another request of the
// key may take it over (the holder died, or is stuck): longer than any
// command runs.
const Lease = time.Minute

// poll bounds the wait between two looks at a key another request holds.
const poll = 20 * time.Millisecond

// claimSQL claims a key: a new row, or one whose lease lapsed or whose TTL
// passed. It returns a row only to the request that claimed.
const claimSQL = `INSERT INTO idempotency_keys AS k (scope, key, request_hash, state, owner, locked_until, created_at, expires_at)
	VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7)
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'pending', owner = EXCLUDED.owner,
		locked_until = EXCLUDED.locked_until, status = NULL, body = NULL, created_at = EXCLUDED.created_at,
		expires_at = EXCLUDED.expires_at
	WHERE k.expires_at <= $6 OR (k.state = 'pending' AND k.locked_until <= $6)
	RETURNING true`

// Begin implements Store. It holds no connection while it waits: a
// request claims its key with a pending row under a lease of its own
// (Lease), and the others look again every few milliseconds until the
// row is done, or its lease lapses (then one of them takes it over).
func (p *Postgres) Begin(ctx context.Context, r Request) (*Answer, func(), error) {
	if err := validRequest(r); err != nil {
		return nil, nil, err
	}
	owner := newOwner()
	for wait := time.Millisecond; ; wait = min(2*wait, poll) {
		now := p.clock()
		var claimed bool
		err := p.pool.QueryRow(ctx, claimSQL, r.Scope, r.Key, r.Hash, owner, now.Add(Lease), now, now.Add(p.ttl)).Scan(&claimed)
		if err == nil {
			return nil, func() { p.release(r, owner) }, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, nil, fmt.Errorf("idempotency: key %q of %s: %w", r.Key, r.Scope, err)
		}
		var (
			hash        []byte
			state       string
			status      *int
			body        []byte
			lockedUntil *time.Time
		)
		err = p.pool.QueryRow(ctx, `SELECT request_hash, state, status, body, locked_until FROM idempotency_keys WHERE scope = $1 AND key = $2`,
			r.Scope, r.Key).Scan(&hash, &state, &status, &body, &lockedUntil)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // released meanwhile: claim again
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("idempotency: key %q of %s: %w", r.Key, r.Scope, err)
		}
		if !bytes.Equal(hash, r.Hash) {
			return nil, nil, fmt.Errorf("key %q of %s: %w", r.Key, r.Scope, ErrMismatch)
		}
		// A committed row's full answer is on its way, unless its request
		// died before saving it: then the committed answer is the answer.
		if status != nil && (state == "done" || (state == "committed" && lockedUntil != nil && !lockedUntil.After(now))) {
			return &Answer{Status: *status, Body: body}, func() {}, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// release gives up a claim that stored no answer, so that the next
// request of the key runs it. A claim that lost its lease is not this
// request's to release.
func (p *Postgres) release(r Request, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = p.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 AND state = 'pending' AND owner = $3`,
		r.Scope, r.Key, owner)
}

func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// insertSQL writes a key's answer: it replaces the request's pending row,
// or the answer stored in its unit of work.
const insertSQL = `INSERT INTO idempotency_keys (scope, key, request_hash, state, status, body, created_at, expires_at)
	VALUES ($1, $2, $3, 'done', $4, $5, $6, $7)
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'done', owner = NULL,
		locked_until = NULL, status = EXCLUDED.status, body = EXCLUDED.body, expires_at = EXCLUDED.expires_at`

// purgeSQL deletes up to 100 expired keys: each Save pays for a few, so
// the purge keeps up with the inserts without a sweeper of its own.
const purgeSQL = `DELETE FROM idempotency_keys WHERE ctid IN (
	SELECT ctid FROM idempotency_keys WHERE expires_at <= $1 LIMIT 100)`

// Save implements Store. It purges a bounded number of expired keys in the
// same round trip.
func (p *Postgres) Save(ctx context.Context, r Request, a Answer) error {
	if err := validRequest(r); err != nil {
		return err
	}
	now := p.clock()
	var b pgx.Batch
	b.Queue(insertSQL, r.Scope, r.Key, r.Hash, a.Status, []byte(a.Body), now, now.Add(p.ttl))
	b.Queue(purgeSQL, now)
	if err := p.pool.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("idempotency: key %q of %s: save: %w", r.Key, r.Scope, err)
	}
	return nil
}

// QueueInsert queues the write of r's committed answer a on b: in a unit
// of work's pipeline, so that the command's effects and its key commit
// together. The row stays under the request's lease; other requests of
// the key wait for Save's full answer, or take this one once the lease
// lapses (the request died after its commit). Its one result is a
// command tag.
func (p *Postgres) QueueInsert(b *pgx.Batch, r Request, a Answer) {
	now := p.clock()
	b.Queue(committedSQL, r.Scope, r.Key, r.Hash, a.Status, []byte(a.Body), now, now.Add(p.ttl), now.Add(Lease))
}

const committedSQL = `INSERT INTO idempotency_keys (scope, key, request_hash, state, status, body, created_at, expires_at, locked_until)
	VALUES ($1, $2, $3, 'committed', $4, $5, $6, $7, $8)
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'committed',
		status = EXCLUDED.status, body = EXCLUDED.body, expires_at = EXCLUDED.expires_at`
