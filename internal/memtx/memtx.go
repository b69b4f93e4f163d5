// Package memtx is the life of a memory store's transaction, shared by the
// memory event store, record store and outbox: a transaction holds its
// store's write lock from Begin until it ends; its operations run one at a
// time and fail with txdone.Err once it has ended; a second
// Commit is a no-op, a Commit after Rollback fails, and a Rollback after
// either is a no-op.
package memtx

import (
	"sync"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Life tracks one transaction.
type Life struct {
	mu      sync.Mutex
	done    bool
	rolled  bool
	release func()
}

// Begin locks write, the store's write lock, until the transaction ends.
// Operations return txdone.Err after the end.
func Begin(write *sync.Mutex) *Life {
	write.Lock()
	return &Life{release: write.Unlock}
}

// Enter starts an operation: it returns false (and the caller returns
// Done()) once the transaction has ended; otherwise the caller must Leave.
func (l *Life) Enter() bool {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return false
	}
	return true
}

// Leave ends an operation Enter admitted.
func (l *Life) Leave() { l.mu.Unlock() }

// Done is the error operations return after the end.
func (l *Life) Done() error { return txdone.Err }

// Commit ends the transaction by running apply, which publishes the staged
// changes, and releases the write lock. After Commit it is a no-op; after
// Rollback it returns the done error.
func (l *Life) Commit(apply func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		if l.rolled {
			return txdone.Err
		}
		return nil
	}
	l.done = true
	apply()
	l.release()
	return nil
}

// Rollback ends the transaction by running discard and releases the write
// lock. It is a no-op after the end.
func (l *Life) Rollback(discard func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.done, l.rolled = true, true
	discard()
	l.release()
}
