package subscription

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/position"
)

// PostgresLeases are Leases in the subscription_leases table (package
// schema). Expiry is the database's clock: hosts' clocks may disagree, the
// database's is one.
type PostgresLeases struct{ pool *pgxpool.Pool }

// NewPostgresLeases returns the leases of the database behind pool.
func NewPostgresLeases(pool *pgxpool.Pool) *PostgresLeases { return &PostgresLeases{pool: pool} }

var _ Leases = (*PostgresLeases)(nil)

// Acquire implements Leases: one upsert that takes the row only when it is
// lapsed or owner's.
func (p *PostgresLeases) Acquire(ctx context.Context, group, unit, owner string, ttl time.Duration) (bool, error) {
	tag, err := p.pool.Exec(ctx, `INSERT INTO subscription_leases AS l (consumer_group, unit, owner, expires_at)
		VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond')
		ON CONFLICT (consumer_group, unit) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE l.owner = excluded.owner OR l.expires_at <= clock_timestamp()`, group, unit, owner, ttl.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("subscription %s/%s: acquire lease: %w", group, unit, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Renew implements Leases. A lapsed lease nobody took is renewed: its
// owner has been the only one since.
func (p *PostgresLeases) Renew(ctx context.Context, group, unit, owner string, ttl time.Duration) (bool, error) {
	tag, err := p.pool.Exec(ctx, `UPDATE subscription_leases SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
		WHERE consumer_group = $1 AND unit = $2 AND owner = $3`, group, unit, owner, ttl.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("subscription %s/%s: renew lease: %w", group, unit, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Release implements Leases.
func (p *PostgresLeases) Release(ctx context.Context, group, unit, owner string) error {
	if _, err := p.pool.Exec(ctx, `DELETE FROM subscription_leases WHERE consumer_group = $1 AND unit = $2 AND owner = $3`,
		group, unit, owner); err != nil {
		return fmt.Errorf("subscription %s/%s: release lease: %w", group, unit, err)
	}
	return nil
}

// Holder implements Leases.
func (p *PostgresLeases) Holder(ctx context.Context, group, unit string) (string, time.Time, bool, error) {
	var owner string
	var exp time.Time
	err := p.pool.QueryRow(ctx, `SELECT owner, expires_at FROM subscription_leases WHERE consumer_group = $1 AND unit = $2`,
		group, unit).Scan(&owner, &exp)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, false, nil
	}
	if err != nil {
		return "", time.Time{}, false, fmt.Errorf("subscription %s/%s: lease holder: %w", group, unit, err)
	}
	return owner, exp.UTC(), true, nil
}

// PostgresFailures are Failures in the subscription_failures table.
type PostgresFailures struct {
	pool *pgxpool.Pool
	// positions advances Park's fence inside Park's transaction.
	positions *position.Postgres
}

// NewPostgresFailures returns the failure records of the database behind
// pool.
func NewPostgresFailures(pool *pgxpool.Pool) *PostgresFailures {
	return &PostgresFailures{pool: pool, positions: position.NewPostgres(pool, nil)}
}

var _ Failures = (*PostgresFailures)(nil)

const recordSQL = `INSERT INTO subscription_failures
	(consumer_group, unit, global_position, message_id, stream, type, partition_key, status, attempts, error, failed_at, updated_at)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), now())
	ON CONFLICT (consumer_group, unit, global_position) DO UPDATE SET status = excluded.status,
		attempts = excluded.attempts, error = excluded.error, partition_key = excluded.partition_key, updated_at = now()`

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func record(ctx context.Context, db execer, f Failure) error {
	_, err := db.Exec(ctx, recordSQL,
		f.Group, f.Unit, f.GlobalPosition, f.MessageID, f.Stream, f.Type, f.Key, string(f.Status), f.Attempts, f.Error)
	if err != nil {
		return fmt.Errorf("subscription %s/%s: record failure at %d: %w", f.Group, f.Unit, f.GlobalPosition, err)
	}
	return nil
}

// Record implements Failures.
func (p *PostgresFailures) Record(ctx context.Context, f Failure) error {
	if err := validFailure(f); err != nil {
		return err
	}
	return record(ctx, p.pool, f)
}

// Park implements Failures: the fenced advance first (its UPDATE takes the
// positions row's lock, ordering it against a new owner's Claim), then the
// record, in one transaction. A refused fence or a failed insert rolls
// both back.
func (p *PostgresFailures) Park(ctx context.Context, f Failure, fence position.Fence) error {
	if err := validPark(f, fence); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if err := p.positions.Tx(tx).Advance(ctx, fence); err != nil {
			return err
		}
		return record(ctx, tx, f)
	})
}

const failureColumns = `consumer_group, unit, global_position, message_id, stream, type, partition_key,
	status, attempts, error, failed_at, updated_at`

// openSQL lists one unit's open records, what an owner's replay and a
// min_position read ask for: its filter is the partial index
// subscription_failures_open's own (migration 0008), without parameters
// that would keep a generic plan from using it.
const openSQL = `SELECT ` + failureColumns + ` FROM subscription_failures
	WHERE consumer_group = $1 AND unit = $2 AND status IN ('failed', 'held', 'retry')
	ORDER BY global_position`

// List implements Failures.
func (p *PostgresFailures) List(ctx context.Context, group, unit string, open bool) ([]Failure, error) {
	var rows pgx.Rows
	var err error
	if open && group != "" && unit != "" {
		rows, err = p.pool.Query(ctx, openSQL, group, unit)
	} else {
		rows, err = p.pool.Query(ctx, `SELECT `+failureColumns+` FROM subscription_failures
			WHERE ($1 = '' OR consumer_group = $1) AND ($2 = '' OR unit = $2)
				AND (NOT $3 OR status IN ('failed', 'held', 'retry'))
			ORDER BY consumer_group COLLATE "C", unit COLLATE "C", global_position`, group, unit, open)
	}
	if err != nil {
		return nil, fmt.Errorf("subscription: list failures: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Failure, error) {
		var f Failure
		var st string
		err := r.Scan(&f.Group, &f.Unit, &f.GlobalPosition, &f.MessageID, &f.Stream, &f.Type, &f.Key, &st, &f.Attempts, &f.Error, &f.FailedAt, &f.Updated)
		f.Status, f.FailedAt, f.Updated = Status(st), f.FailedAt.UTC(), f.Updated.UTC()
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("subscription: list failures: %w", err)
	}
	return out, nil
}

// Mark implements Failures: the status check and the update under the
// row's lock.
func (p *PostgresFailures) Mark(ctx context.Context, group, unit string, pos int64, action string) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var have string
		err := tx.QueryRow(ctx, `SELECT status FROM subscription_failures
			WHERE consumer_group = $1 AND unit = $2 AND global_position = $3 FOR UPDATE`, group, unit, pos).Scan(&have)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound(group, unit, pos)
		}
		if err != nil {
			return fmt.Errorf("subscription %s/%s: mark failure at %d: %w", group, unit, pos, err)
		}
		st, err := nextStatus(group, unit, pos, Status(have), action)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE subscription_failures SET status = $4, updated_at = now()
			WHERE consumer_group = $1 AND unit = $2 AND global_position = $3`, group, unit, pos, string(st))
		return err
	})
}

// Resolve implements Failures.
func (p *PostgresFailures) Resolve(ctx context.Context, group, unit string, pos int64, status Status, attempts int, msg string) error {
	tag, err := p.pool.Exec(ctx, `UPDATE subscription_failures SET status = $4, attempts = $5, error = $6, updated_at = now()
		WHERE consumer_group = $1 AND unit = $2 AND global_position = $3`, group, unit, pos, string(status), attempts, msg)
	if err != nil {
		return fmt.Errorf("subscription %s/%s: resolve failure at %d: %w", group, unit, pos, err)
	}
	if tag.RowsAffected() == 0 {
		return notFound(group, unit, pos)
	}
	return nil
}

// Settle implements Failures: the source's removal under the generation,
// then the record's update, in one transaction (the positions row locked
// first, as Park does, so the two never wait on each other in turn).
func (p *PostgresFailures) Settle(ctx context.Context, group, unit string, pos int64, attempts int, generation int64) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := p.positions.Tx(tx).Forget(ctx, group, unit, generation, RetrySource(pos)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE subscription_failures SET status = $4, attempts = $5, error = '', updated_at = now()
			WHERE consumer_group = $1 AND unit = $2 AND global_position = $3`, group, unit, pos, string(StatusResolved), attempts)
		if err != nil {
			return fmt.Errorf("subscription %s/%s: resolve failure at %d: %w", group, unit, pos, err)
		}
		if tag.RowsAffected() == 0 {
			return notFound(group, unit, pos)
		}
		return nil
	})
}

func notFound(group, unit string, pos int64) error {
	return fmt.Errorf("subscription %s/%s: position %d: %w", group, unit, pos, ErrNotFound)
}

func validFailure(f Failure) error {
	if f.Group == "" || f.Unit == "" || f.GlobalPosition < 1 {
		return fmt.Errorf("subscription: failure record %q/%q at %d: %w", f.Group, f.Unit, f.GlobalPosition, ErrInvalid)
	}
	return nil
}

// validPark checks f, and that fence is f's unit's.
func validPark(f Failure, fence position.Fence) error {
	if err := validFailure(f); err != nil {
		return err
	}
	if fence.Group != f.Group || fence.Unit != f.Unit {
		return fmt.Errorf("subscription: failure record %s/%s parked with the fence of %s/%s: %w",
			f.Group, f.Unit, fence.Group, fence.Unit, ErrInvalid)
	}
	return nil
}

// PostgresHead returns the head global position of a category (All: of
// the store) in the event store behind pool, for Options.Head: the last
// position, through MessageDB's category index.
func PostgresHead(pool *pgxpool.Pool) func(ctx context.Context, category string) (int64, error) {
	return func(ctx context.Context, category string) (int64, error) {
		var head int64
		var err error
		if category == All {
			err = pool.QueryRow(ctx, `SELECT coalesce(max(global_position), 0) FROM message_store.messages`).Scan(&head)
		} else {
			err = pool.QueryRow(ctx, `SELECT coalesce(max(global_position), 0) FROM message_store.messages
				WHERE message_store.category(stream_name) = $1`, category).Scan(&head)
		}
		return head, err
	}
}
