package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a Log in the table protean_audit (migration 0013).
type Postgres struct {
	pool *pgxpool.Pool
}

// NewPostgres returns the Log of the database pool reaches.
func NewPostgres(pool *pgxpool.Pool) *Postgres { return &Postgres{pool: pool} }

// Append implements Log. An entry without a time takes the database's.
func (p *Postgres) Append(ctx context.Context, e Entry) (int64, error) {
	e, err := clip(e)
	if err != nil {
		return 0, err
	}
	var at any
	if !e.At.IsZero() {
		at = e.At
	}
	var id int64
	err = p.pool.QueryRow(ctx, `INSERT INTO protean_audit (at, principal, tenant, action, target, outcome, reason)
		VALUES (coalesce($1, now()), $2, $3, $4, $5, $6, $7) RETURNING id`,
		at, e.Principal, e.Tenant, e.Action, e.Target, e.Outcome, e.Reason).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("audit: recording %s on %s: %w", e.Action, e.Target, err)
	}
	return id, nil
}

// List implements Log.
func (p *Postgres) List(ctx context.Context, q Query) ([]Entry, error) {
	rows, err := p.pool.Query(ctx, `SELECT id, at, principal, tenant, action, target, outcome, reason FROM protean_audit
		WHERE ($1 = 0 OR id < $1) AND ($2::text[] IS NULL OR tenant = ANY($2))
		ORDER BY id DESC LIMIT $3`, q.Before, q.Tenants, q.limit())
	if err != nil {
		return nil, fmt.Errorf("audit: listing: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Entry])
	if err != nil {
		return nil, fmt.Errorf("audit: listing: %w", err)
	}
	if out == nil {
		out = []Entry{}
	}
	return out, nil
}
