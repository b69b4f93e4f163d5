// Package txdone is the one "transaction already ended" error of the
// stores. The event store, record store, outbox and position store each
// export it under their own name (eventstore.ErrTxDone and so on) as an
// alias of [Err], so errors.Is holds across packages: a unit of work that
// spans several stores needs one test, not four. [Closed] is the one place
// that recognises pgx's own closed-transaction error.
package txdone

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// Err means a transaction was used after Commit or Rollback.
var Err = errors.New("transaction already committed or rolled back")

// Closed reports whether err says the transaction has ended: [Err] itself
// or pgx's ErrTxClosed, which a store returns as [Err].
func Closed(err error) bool {
	return errors.Is(err, Err) || errors.Is(err, pgx.ErrTxClosed)
}
