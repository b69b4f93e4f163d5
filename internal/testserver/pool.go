package testserver

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/schema"
)

// PostgresPool returns a pool on a new database that schema.Migrate has
// migrated. The pool is closed, and the database dropped, when tb ends.
func PostgresPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := Postgres(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	tb.Cleanup(pool.Close)
	if _, err := schema.Migrate(ctx, pool); err != nil {
		tb.Fatalf("testserver: %v", err)
	}
	return pool
}
