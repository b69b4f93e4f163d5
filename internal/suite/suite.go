// Package suite is what the conformance suites (eventstore/storetest,
// record/storetest, outbox/storetest, position/positiontest) share: a
// table of named cases run as parallel subtests, a transaction opened for
// one test and always ended, and a clock that moves only when a test moves
// it. Each suite keeps its own cases and harness; only the driving is here.
package suite

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Run runs every case, by name in byte order, as a parallel subtest: run
// gets the subtest and the case's function (F is the suite's test function
// type), and calls it with a fresh harness (a harness is never shared
// between cases).
func Run[F any](t *testing.T, cases map[string]F, run func(t *testing.T, fn F)) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run(t, cases[name])
		})
	}
}

// Tx is the end of a suite transaction, as every store's transaction ends.
type Tx interface {
	// Commit applies what the transaction staged. After Rollback it fails
	// with the store's ErrTxDone (txdone.Err).
	Commit(ctx context.Context) error
	// Rollback discards what it staged. After Commit it is a no-op.
	Rollback(ctx context.Context) error
}

// Harness is one store under test: S is the store, T its suite transaction.
// Store must be empty and not shared with any other Harness. Begin opens a
// transaction on Store; the suites never write through Store from the
// goroutine that holds an open transaction (that may block).
type Harness[S any, T Tx] struct {
	Store S
	Begin func(ctx context.Context) (T, error)
}

// Begin opens a transaction with begin (a harness's Begin) and rolls it
// back when the test ends: a failed assertion must not leave it open, since
// it holds a pooled connection (or a memory store's lock) that the
// harness's cleanup would wait for. A Rollback after Commit is a no-op in
// every store.
func Begin[T Tx](t *testing.T, begin func(context.Context) (T, error)) T {
	t.Helper()
	require.NotNil(t, begin, "Harness.Begin is required")
	tx, err := begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// Start is where every suite clock starts.
var Start = time.Date(2026, 8, 21, 9, 0, 0, 0, time.UTC)

// Clock is a suite's time; it moves only when a test moves it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at Start.
func NewClock() *Clock { return &Clock{now: Start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
