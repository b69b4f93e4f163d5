package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a Store in the idempotency_keys table of a database migrated
// by package schema. It is safe for concurrent use, by many hosts.
//
// Its times are the database's: every lease, expiry and "has it lapsed"
// is computed in the SQL from now(), as the subscription leases are, never
// from a host's clock. Hosts' clocks differ; with a lease from each host's
// own clock, a host whose clock ran ahead by more than the lease would
// take a key another host's request still held and run its command twice.
// (now() is the statement's transaction start: a key written in a unit of
// work's transaction starts its lease the few milliseconds before the
// commit that the transaction took, well inside any lease.)
type Postgres struct {
	pool  *pgxpool.Pool
	ttl   time.Duration
	lease time.Duration
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a store on pool's database that keeps answers for
// ttl (DefaultTTL if <= 0), by the database's clock.
func NewPostgres(pool *pgxpool.Pool, ttl time.Duration) *Postgres {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Postgres{pool: pool, ttl: ttl, lease: Lease}
}

// WithLease returns a copy of p whose requests hold their keys under lease
// instead of Lease (lease <= 0 keeps p's). The host gives its partition
// lease TTL, so that a host that dies mid-command holds the command's key
// no longer than it holds anything else; the renewal every lease/3 keeps a
// slow command's key.
func (p *Postgres) WithLease(lease time.Duration) *Postgres {
	c := *p
	if lease > 0 {
		c.lease = lease
	}
	return &c
}

// Lease is how long p's requests hold their keys past their last renewal
// (see WithLease).
func (p *Postgres) Lease() time.Duration { return p.lease }

// TTL is how long the store keeps a key.
func (p *Postgres) TTL() time.Duration { return p.ttl }

// Lease is how long a request's key outlives the request's last sign of
// life before another request of the key may take it over: the holder
// renews it every Lease/3 while it runs (see heartbeat), so a command may
// run longer than Lease; a dead host's key is free within Lease.
const Lease = time.Minute

// poll bounds the wait between two looks at a key another request holds.
const poll = 20 * time.Millisecond

// us is a duration as the SQL's microseconds parameter: the statements
// add it to now() ($n * interval '1 microsecond').
func us(d time.Duration) int64 { return d.Microseconds() }

// claimSQL claims a key: a new row, or one whose lease lapsed or whose TTL
// passed, by the database's clock (EXCLUDED.created_at is now()). It
// returns a row only to the request that claimed. $5 lease, $6 TTL.
const claimSQL = `INSERT INTO idempotency_keys AS k (scope, key, request_hash, state, owner, locked_until, created_at, expires_at)
	VALUES ($1, $2, $3, 'pending', $4, now() + $5 * interval '1 microsecond', now(), now() + $6 * interval '1 microsecond')
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'pending', owner = EXCLUDED.owner,
		locked_until = EXCLUDED.locked_until, status = NULL, body = NULL, created_at = EXCLUDED.created_at,
		expires_at = EXCLUDED.expires_at
	WHERE k.expires_at <= EXCLUDED.created_at OR (k.state = 'pending' AND k.locked_until <= EXCLUDED.created_at)
	RETURNING true`

// lookSQL reads a key another request holds, and whether its lease has
// lapsed by the database's clock (NULL without a lease).
const lookSQL = `SELECT request_hash, state, status, body, locked_until <= now()
	FROM idempotency_keys WHERE scope = $1 AND key = $2`

// Begin implements Store. It holds no connection while it waits: a
// request claims its key with a pending row under a lease of its own
// (Lease, renewed while the request runs: heartbeat), and the others look
// again every few milliseconds until the row is done, or its lease lapses
// (then one of them takes it over).
func (p *Postgres) Begin(ctx context.Context, r Request) (*Answer, func(answered bool), error) {
	if err := validRequest(r); err != nil {
		return nil, nil, err
	}
	owner := newOwner()
	for wait := time.Millisecond; ; wait = min(2*wait, poll) {
		claimed, err := p.claim(ctx, r, owner)
		if err != nil {
			return nil, nil, fmt.Errorf("idempotency: key %q of %s: %w", r.Key, r.Scope, err)
		}
		if claimed {
			stop := p.heartbeat(ctx, r, owner)
			return nil, func(answered bool) {
				stop()
				if !answered {
					p.release(r, owner)
				}
			}, nil
		}
		var (
			hash   []byte
			state  string
			status *int
			body   []byte
			lapsed *bool
		)
		err = p.pool.QueryRow(ctx, lookSQL, r.Scope, r.Key).Scan(&hash, &state, &status, &body, &lapsed)
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
		if status != nil && (state == "done" || (state == "committed" && lapsed != nil && *lapsed)) {
			return &Answer{Status: *status, Body: body}, func(bool) {}, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// claim tries to claim r's key for owner (claimSQL) and purges a bounded
// number of expired keys (purgeSQL), in one round trip.
func (p *Postgres) claim(ctx context.Context, r Request, owner string) (claimed bool, _ error) {
	var b pgx.Batch
	b.Queue(claimSQL, r.Scope, r.Key, r.Hash, owner, us(p.lease), us(p.ttl)).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&claimed); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	})
	b.Queue(purgeSQL)
	return claimed, p.pool.SendBatch(ctx, &b).Close()
}

// renewSQL extends owner's lease on a key its request still holds:
// pending, or committed by the request's unit of work and waiting for the
// full answer.
const renewSQL = `UPDATE idempotency_keys SET locked_until = now() + $4 * interval '1 microsecond'
	WHERE scope = $1 AND key = $2 AND owner = $3 AND state IN ('pending', 'committed')`

// heartbeat renews owner's lease on r's key every lease/3 while the
// request runs, so that a command slower than the lease (a slow handler,
// retries) is not run again by a repeat that would take the key over. It
// ends when stop is called (the request is done) or ctx ends (the request
// is over: its client went away, its host is stopping); then the lease
// lapses within one lease, as a dead host's does. A renewal that finds the
// key no longer the request's (saved, released, taken over) ends it too.
// A failed renewal is tried again at the next tick: a lease is three
// ticks long. stop returns once the goroutine has ended.
func (p *Postgres) heartbeat(ctx context.Context, r Request, owner string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(p.lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tag, err := p.pool.Exec(ctx, renewSQL, r.Scope, r.Key, owner, us(p.lease))
			if err == nil && tag.RowsAffected() == 0 {
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-ended
		})
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
	VALUES ($1, $2, $3, 'done', $4, $5, now(), now() + $6 * interval '1 microsecond')
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'done', owner = NULL,
		locked_until = NULL, status = EXCLUDED.status, body = EXCLUDED.body, expires_at = EXCLUDED.expires_at`

// purgeSQL deletes up to 100 expired keys: each claim pays for a few (in
// its own round trip, see claim), so the purge keeps up with the inserts
// without a sweeper of its own.
const purgeSQL = `DELETE FROM idempotency_keys WHERE ctid IN (
	SELECT ctid FROM idempotency_keys WHERE expires_at <= now() LIMIT 100)`

// Save implements Store.
func (p *Postgres) Save(ctx context.Context, r Request, a Answer) error {
	if err := validRequest(r); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, insertSQL, r.Scope, r.Key, r.Hash, a.Status, []byte(a.Body), us(p.ttl)); err != nil {
		return fmt.Errorf("idempotency: key %q of %s: save: %w", r.Key, r.Scope, err)
	}
	return nil
}

// QueueInsert queues the write of r's committed answer a on b: in a unit
// of work's pipeline, so that the command's effects and its key commit
// together. Its one result is a command tag.
//
// A final answer (the command dispatches no follow-up commands, so the
// API's answer is this one) is stored done, as Save would store it, and
// the API need not Save it: one round trip less per keyed command. Any
// other stays under the request's lease: other requests of the key wait
// for Save's full answer, or take this one once the lease lapses (the
// request died after its commit).
func (p *Postgres) QueueInsert(b *pgx.Batch, r Request, a Answer, final bool) {
	if final {
		b.Queue(insertSQL, r.Scope, r.Key, r.Hash, a.Status, []byte(a.Body), us(p.ttl))
		return
	}
	b.Queue(committedSQL, r.Scope, r.Key, r.Hash, a.Status, []byte(a.Body), us(p.ttl), us(p.lease))
}

const committedSQL = `INSERT INTO idempotency_keys (scope, key, request_hash, state, status, body, created_at, expires_at, locked_until)
	VALUES ($1, $2, $3, 'committed', $4, $5, now(), now() + $6 * interval '1 microsecond', now() + $7 * interval '1 microsecond')
	ON CONFLICT (scope, key) DO UPDATE SET request_hash = EXCLUDED.request_hash, state = 'committed',
		status = EXCLUDED.status, body = EXCLUDED.body, expires_at = EXCLUDED.expires_at`
