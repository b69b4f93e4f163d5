// Package schema owns the host's PostgreSQL tables and migrates a database
// to them.
//
// The migrations are the numbered .sql files under migrations/, embedded in
// the binary and applied in order by [Migrate]: each in a transaction of its
// own, recorded in protean_schema_migrations(version, name, applied_at), and
// never applied twice. Migrate takes a transaction-level advisory lock
// before each step, so several hosts migrating one database at once apply
// every step once and in order. [Check] is what a host runs at start: it
// fails with [ErrNotMigrated] while the database is missing a step, so that
// the operator runs `protean-host migrate` instead of the host failing on
// its first write.
//
// The tables:
//
//   - message_store.messages and the functions category, hash_64,
//     acquire_lock, stream_version and write_message, as MessageDB defines
//     them (package eventstore);
//   - records (package record);
//   - outbox (package outbox);
//   - consumer_positions (package position);
//   - idempotency_keys (package idempotency);
//   - subscription_leases and subscription_failures (package subscription);
//   - protean_audit (package audit).
package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var files embed.FS

// ErrNotMigrated means the database lacks tables or migrations this host
// needs.
var ErrNotMigrated = errors.New("database schema is not migrated")

// lockKey is the advisory lock migrations hold; an arbitrary constant
// ("protean" in ASCII) that no other lock of the host uses.
const lockKey int64 = 0x70726f7465616e

// Migration is one step of the schema.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var migrations = mustLoad()

// Migrations returns the steps this host knows, in order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// Latest returns the version of the last step.
func Latest() int { return migrations[len(migrations)-1].Version }

// mustLoad reads the embedded files, named NNNN_name.sql.
func mustLoad() []Migration {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			panic("schema: migration file " + e.Name() + ": want NNNN_name.sql")
		}
		sql, err := files.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(sql)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("schema: migration %d (%s): versions must run 1, 2, 3, … without gaps", m.Version, m.Name))
		}
	}
	return out
}

const createTable = `CREATE TABLE IF NOT EXISTS protean_schema_migrations (
	version integer PRIMARY KEY,
	name text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// Migrate applies the steps the database lacks and returns their names
// ("0002_records"), in order; none when it is up to date. A step that fails
// is rolled back whole, and the steps before it stay applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (applied []string, err error) {
	for _, m := range migrations {
		done, err := migrateOne(ctx, pool, m)
		if err != nil {
			return applied, fmt.Errorf("schema: migration %04d_%s: %w", m.Version, m.Name, err)
		}
		if done {
			applied = append(applied, fmt.Sprintf("%04d_%s", m.Version, m.Name))
		}
	}
	return applied, nil
}

// migrateOne applies m unless it is recorded, under the migration lock.
func migrateOne(ctx context.Context, pool *pgxpool.Pool, m Migration) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, createTable); err != nil {
		return false, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM protean_schema_migrations WHERE version = $1)`, m.Version).Scan(&exists); err != nil {
		return false, err
	}
	if exists {
		return false, nil
	}
	// No arguments: pgx sends it as a simple query, which may hold several
	// statements.
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO protean_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// Check returns nil when every step this host knows is applied, and an
// error wrapping ErrNotMigrated, which tells the operator what to run, when
// some is not. A database migrated by a newer host passes: steps only add.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT version FROM protean_schema_migrations`)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			return notMigrated("it has no protean tables")
		}
		return fmt.Errorf("schema: check: %w", err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			return notMigrated("it has no protean tables")
		}
		return fmt.Errorf("schema: check: %w", err)
	}
	applied := make(map[int]bool, len(have))
	for _, v := range have {
		applied[v] = true
	}
	var missing []string
	for _, m := range migrations {
		if !applied[m.Version] {
			missing = append(missing, fmt.Sprintf("%04d_%s", m.Version, m.Name))
		}
	}
	if len(missing) > 0 {
		return notMigrated("it lacks " + strings.Join(missing, ", "))
	}
	return nil
}

func notMigrated(why string) error {
	return fmt.Errorf("%w: %s; run `protean-host migrate --config FILE` (FILE being this host's config)", ErrNotMigrated, why)
}
