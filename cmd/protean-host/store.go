package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/idempotency"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/internal/schema"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// stores are the three stores and the unit-of-work backend over them.
type stores struct {
	events  eventstore.Store
	records record.Store
	outbox  interface {
		outbox.RelayStore
		outbox.Store
	}
	// positions is the table of consumer positions the partition workers
	// claim and fence in; the backend advances it in effect transactions.
	positions interface {
		partition.Positions
		List(ctx context.Context, group string) ([]position.Row, error)
	}
	backend unitofwork.Backend
	// leases and failures are the event-store subscriptions' (package
	// subscription); head is the lag metric's head position (nil: none).
	leases   subscription.Leases
	failures subscription.Failures
	head     func(ctx context.Context, category string) (int64, error)
	// idempotency keeps the answers of commands sent with an
	// Idempotency-Key (in the database, written in each command's unit of
	// work, or in memory).
	idempotency idempotency.Store
	// audit keeps the operators' and deployers' actions (package audit).
	audit audit.Log
	// pool is the PostgreSQL connection pool; nil on memory stores.
	pool  *pgxpool.Pool
	close func()
}

// errMemoryOnly is returned by commands that need a database when the
// config has none.
var errMemoryOnly = errors.New("databases.default.provider is \"memory\": there is no database to act on (the memory stores live inside a running host)")

// postgresURI returns the one PostgreSQL database the config uses, or
// errMemoryOnly, or an error naming the keys that disagree. Records, events
// and outbox share one database so a unit of work is one transaction.
func postgresURI(cfg config.Config) (string, error) {
	db := cfg.Databases[config.DefaultName]
	es := cfg.EventStore
	switch {
	case db.Provider == config.ProviderMemory && es.Provider == config.ProviderMemory:
		return "", errMemoryOnly
	case db.Provider != config.ProviderPostgreSQL || es.Provider != config.ProviderMessageDB:
		return "", fmt.Errorf("databases.default.provider %q with event_store.provider %q: use memory with memory, or postgresql with message_db",
			db.Provider, es.Provider)
	case db.DatabaseURI != es.DatabaseURI:
		return "", errors.New("event_store.database_uri must equal databases.default.database_uri: events, records and outbox rows commit in one transaction")
	}
	return db.DatabaseURI, nil
}

// openPool connects to the config's PostgreSQL database.
func openPool(ctx context.Context, cfg config.Config) (*pgxpool.Pool, error) {
	uri, err := postgresURI(cfg)
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(uri)
	if err != nil {
		return nil, fmt.Errorf("databases.default.database_uri: %w", err)
	}
	if _, set := pcfg.ConnConfig.RuntimeParams[idleInTxParam]; !set {
		pcfg.ConnConfig.RuntimeParams[idleInTxParam] = strconv.FormatInt(idleInTxTimeout(cfg).Milliseconds(), 10)
	}
	if !strings.Contains(uri, "pool_max_conns") {
		share, err := serverShare(ctx, pcfg.ConnConfig)
		if err != nil {
			return nil, fmt.Errorf("connecting to PostgreSQL (databases.default.database_uri): %w", err)
		}
		pcfg.MaxConns = int32(min(defaultPostgresPool, share))
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("databases.default.database_uri: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to PostgreSQL (databases.default.database_uri): %w", err)
	}
	return pool, nil
}

// serverShare is the most connections one host takes of the server's:
// a quarter of those open to ordinary roles (max_connections less the
// superuser's reserve), so that four hosts, and an operator's tools, fit.
// PostgreSQL's default (100, 3 reserved) gives 24.
func serverShare(ctx context.Context, cc *pgx.ConnConfig) (int, error) {
	conn, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var open int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).Scan(&open)
	return max(1, open/4), err
}

// idleInTxParam bounds how long a session may sit in an open transaction
// without sending anything: PostgreSQL then ends the session and its locks
// go with it. A host that stalls (a frozen VM, a stopped process) in the
// middle of a transaction would otherwise hold its row and advisory locks
// (a partition's positions row, a category's append lock, the relay's claim
// lock) and stall every other host until it resumed. The hosts' own
// transactions never wait on anything but the database between statements.
// A database_uri that sets the parameter keeps its value.
const idleInTxParam = "idle_in_transaction_session_timeout"

// idleInTxTimeout is the partition lease TTL, so that a stalled host holds
// database locks no longer than its leases, and at least 5 s, so that a
// loaded machine's pause between two statements does not end a healthy
// transaction.
func idleInTxTimeout(cfg config.Config) time.Duration {
	return max(cfg.Server.Partitioning.LeaseTTL(), 5*time.Second)
}

func openStores(ctx context.Context, cfg config.Config) (*stores, error) {
	if _, err := postgresURI(cfg); errors.Is(err, errMemoryOnly) {
		mem := unitofwork.NewMemory()
		return &stores{events: mem.Events, records: mem.Records, outbox: mem.Outbox, positions: mem.Positions, backend: mem,
			leases: &subscription.MemoryLeases{}, failures: &subscription.MemoryFailures{Positions: mem.Positions},
			idempotency: idempotency.NewMemory(cfg.HTTP.IdempotencyTTL(), nil), audit: audit.NewMemory(nil), close: func() {}}, nil
	}
	pool, err := openMigratedPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pg := unitofwork.NewPostgres(pool)
	return &stores{events: pg.Events, records: pg.Records, outbox: pg.Outbox, positions: pg.Positions, backend: pg,
		leases: subscription.NewPostgresLeases(pool), failures: subscription.NewPostgresFailures(pool),
		head: subscription.PostgresHead(pool), idempotency: idempotency.NewPostgres(pool, cfg.HTTP.IdempotencyTTL()).WithLease(cfg.Server.Partitioning.LeaseTTL()),
		audit: audit.NewPostgres(pool), pool: pool, close: pool.Close}, nil
}

// openMigratedPool connects to the config's database and checks that it is
// migrated: what the operator commands that act on it need first.
func openMigratedPool(ctx context.Context, cfg config.Config) (*pgxpool.Pool, error) {
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := schema.Check(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// progress is the read-your-writes source of what the event-store
// subscriptions (fromStore) or the partition workers (partitioned)
// deliver, from the stores they commit to; nil when neither runs.
func (st *stores) progress(partitioned, fromStore bool) readyourwrites.Source {
	switch {
	case fromStore:
		return &subscription.Progress{Positions: st.positions, Failures: st.failures}
	case partitioned:
		return &partition.Progress{Positions: st.positions}
	}
	return nil
}
