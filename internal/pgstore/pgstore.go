package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/dbtime"
)

// Store is a store's database and clock: Now is the clock's time as the
// store records it.
type Store struct {
	Pool *pgxpool.Pool
	dbtime.Clock
}

// New returns the base of a store on pool's database that reads time from
// now; nil means time.Now.
func New(pool *pgxpool.Pool, now func() time.Time) Store {
	return Store{Pool: pool, Clock: dbtime.NewClock(now)}
}

// In returns the store's view inside tx, a caller's transaction.
func (s Store) In(tx pgx.Tx) Tx { return Tx{Tx: tx, Clock: s.Clock} }

// Tx is a store's view inside a caller's transaction: its statements run
// in Tx, not on the store's pool, at the store's clock. Like the pgx.Tx,
// it is for one goroutine at a time.
type Tx struct {
	Tx pgx.Tx
	dbtime.Clock
}
