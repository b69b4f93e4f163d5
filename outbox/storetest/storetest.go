// Package storetest is the conformance suite for outbox.Store
// implementations. Every implementation (memory, PostgreSQL) runs it from a
// test of its own:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Harness { ... })
//	}
//
// The suite drives time through the clock it passes in, so the store must
// read time only from it. It uses only the interfaces below.
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/suite"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// Tx is a transaction that adds rows, as the suite drives it. The memory
// store's *outbox.MemoryTx fits after a thin adapter; a PostgreSQL store
// wraps its pgx.Tx.
type Tx interface {
	// Add checks and stages rows, all or nothing.
	Add(ctx context.Context, rows []outbox.Row) error
	suite.Tx
}

// Harness is one store under test.
type Harness struct {
	Store outbox.Store
	Begin func(ctx context.Context) (Tx, error)
	// Positions is the table of consumer positions the store's Republish
	// reads (the same database, or the memory store it was given).
	Positions position.Store
}

// Run runs the suite. newHarness is called once per subtest, possibly from
// parallel subtests, with the clock the store must use.
func Run(t *testing.T, newHarness func(t *testing.T, now func() time.Time) Harness) {
	suite.Run(t, map[string]func(t *testing.T, h Harness, c *clock){
		"AddAndClaim":                             testAddAndClaim,
		"ClaimOrderByPriorityThenID":              testClaimOrder,
		"ClaimLimitAndDefaults":                   testClaimLimit,
		"ConcurrentClaimersNeverShareARow":        testConcurrentClaimers,
		"ExpiredLockIsReclaimedAtTheExactInstant": testExpiredLock,
		"FailedRowIsDueAtTheExactInstant":         testFailedDue,
		"RetriesThenAbandonsKeepingLastError":     testRetryThenAbandon,
		"RowsPastMaxRetriesAreNeverClaimed":       testMaxRetries,
		"NonOwnerMarksRejected":                   testNonOwner,
		"Abandon":                                 testAbandon,
		"RetryCommand":                            testRetryCommand,
		"Cleanup":                                 testCleanup,
		"Stats":                                   testStats,
		"Duplicates":                              testDuplicates,
		"TxStagedUntilCommit":                     testTxStaged,
		"TxRollbackDiscards":                      testTxRollback,
		"TxDone":                                  testTxDone,
		"InvalidInput":                            testInvalidInput,
		"CancelledContext":                        testCancelledContext,
		"RowsAreCopies":                           testRowsAreCopies,
		"ClaimIsPerBroker":                        testClaimPerBroker,
		"RacingClaimersNeverHoldTwoRowsOfOneKey":  testRacingClaimersPerKey,
		"FailingRowHoldsBackOnlyItsKey":           testFailingRowHoldsBackItsKey,
		"OrderingKeyParts":                        testOrderingKeyParts,
		"CrashBeforeMarkIsRedelivered":            testCrashBeforeMark,
		"BatchMarksNeedTheLock":                   testBatchMarksNeedTheLock,
		"RepublishAfterTheBrokerLostItsData":      testRepublish,
		"RepublishKeepsWhatEveryConsumerApplied":  testRepublishKeeps,
		"KeyOrderHoldsAcrossPriorities":           testKeyOrderAcrossPriorities,
		"ClaimChainedGivesEachRowItsPrev":         testClaimChained,
		"ClaimFindsTheFreeKeyBehindHeldOnes":      testClaimBehindHeldKeys,
		"RelayLeaseHasOneHolderPerBroker":         testRelayLease,
		"RelayLeasesRacingTakeOneHolder":          testRelayLeaseRace,
		"RelayWakesReachTheirBrokersListeners":    testRelayWakes,
	}, func(t *testing.T, fn func(*testing.T, Harness, *clock)) {
		c := suite.NewClock()
		fn(t, newHarness(t, c.Now), c)
	})
}

// start is where the suite's clock starts.
var start = suite.Start

// clock is the suite's time; it moves only when a test moves it.
type clock = suite.Clock

func row(msg string, priority int) outbox.Row {
	return outbox.Row{
		MessageID:    msg,
		Stream:       "order-" + msg,
		Type:         "OrderPlaced",
		Data:         json.RawMessage(fmt.Sprintf(`{"msg": %q}`, msg)),
		Priority:     priority,
		TargetBroker: "default",
	}
}

func begin(t *testing.T, h Harness) Tx {
	t.Helper()
	return suite.Begin(t, h.Begin)
}

func add(t *testing.T, h Harness, rows ...outbox.Row) {
	t.Helper()
	tx := begin(t, h)
	require.NoError(t, tx.Add(t.Context(), rows))
	require.NoError(t, tx.Commit(t.Context()))
}

// claim claims rows for the "default" broker.
func claim(t *testing.T, h Harness, owner string, limit int, lockFor time.Duration) []outbox.Row {
	t.Helper()
	return claimFor(t, h, "default", owner, limit, lockFor)
}

func claimFor(t *testing.T, h Harness, broker, owner string, limit int, lockFor time.Duration) []outbox.Row {
	t.Helper()
	rows, err := h.Store.Claim(t.Context(), broker, owner, limit, lockFor)
	require.NoError(t, err)
	for _, r := range rows {
		require.Equal(t, broker, r.TargetBroker, "a claim returns its broker's rows only")
	}
	return rows
}

func claimOne(t *testing.T, h Harness, owner string) outbox.Row {
	t.Helper()
	rows := claim(t, h, owner, 1, time.Minute)
	require.Len(t, rows, 1)
	return rows[0]
}

func get(t *testing.T, h Harness, id int64) outbox.Row {
	t.Helper()
	r, err := h.Store.Get(t.Context(), id)
	require.NoError(t, err)
	return r
}

// idsOf lists the rows' IDs.
func idsOf(rows []outbox.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// publish claims up to 10 rows for owner and marks them published, as a
// relay's pass does; it returns them.
func publish(t *testing.T, h Harness, owner string) []outbox.Row {
	t.Helper()
	rows := claim(t, h, owner, 10, time.Minute)
	require.NoError(t, h.Store.MarkPublishedBatch(t.Context(), owner, idsOf(rows)))
	return rows
}

// atGlobal is r with the event's global position in its metadata, as the
// unit of work writes it.
func atGlobal(r outbox.Row, gp int) outbox.Row {
	r.Metadata = json.RawMessage(fmt.Sprintf(`{"global_position": %d}`, gp))
	return r
}

func messages(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.MessageID
	}
	return out
}

func requireTime(t *testing.T, want time.Time, got *time.Time, field string) {
	t.Helper()
	require.NotNil(t, got, field)
	require.True(t, want.Equal(*got), "%s: want %v, got %v", field, want, *got)
}

func requireJSON(t *testing.T, want, got json.RawMessage, field string) {
	t.Helper()
	if len(want) == 0 || string(want) == "null" {
		require.True(t, len(got) == 0 || string(got) == "null", "%s: want none, got %s", field, got)
		return
	}
	require.JSONEq(t, string(want), string(got), field)
}

// requireSameRow compares rows field by field: JSON by meaning, times by
// instant.
func requireSameRow(t *testing.T, want, got outbox.Row) {
	t.Helper()
	timeEq := func(w, g *time.Time, field string) {
		if w == nil {
			require.Nil(t, g, field)
			return
		}
		requireTime(t, *w, g, field)
	}
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.MessageID, got.MessageID)
	require.Equal(t, want.Stream, got.Stream)
	require.Equal(t, want.Category, got.Category)
	require.Equal(t, want.Type, got.Type)
	requireJSON(t, want.Data, got.Data, "data")
	requireJSON(t, want.Metadata, got.Metadata, "metadata")
	require.Equal(t, want.PartitionKey, got.PartitionKey)
	require.Equal(t, want.Priority, got.Priority)
	require.Equal(t, want.TargetBroker, got.TargetBroker)
	require.Equal(t, want.Status, got.Status)
	require.Equal(t, want.RetryCount, got.RetryCount)
	require.Equal(t, want.MaxRetries, got.MaxRetries)
	timeEq(want.NextRetryAt, got.NextRetryAt, "next_retry_at")
	timeEq(want.LockedUntil, got.LockedUntil, "locked_until")
	require.Equal(t, want.LockedBy, got.LockedBy)
	require.Equal(t, want.LastError, got.LastError)
	require.True(t, want.CreatedAt.Equal(got.CreatedAt), "created_at: want %v, got %v", want.CreatedAt, got.CreatedAt)
	timeEq(want.PublishedAt, got.PublishedAt, "published_at")
}

func testAddAndClaim(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	key := "client-1"
	in := row("m-1", 2)
	in.Metadata = json.RawMessage(`{"correlation_id": "c-1"}`)
	in.PartitionKey = &key
	// Fields the store owns are ignored on Add.
	in.ID, in.Status, in.RetryCount, in.LockedBy, in.LastError = 99, outbox.StatusPublished, 7, "x", "y"
	in.CreatedAt = start.Add(-time.Hour)
	other := row("m-2", 0)
	other.Category = "sales"
	other.MaxRetries = 7
	add(t, h, in, other)

	got := claim(t, h, "relay-1", 10, time.Minute)
	require.Equal(t, []string{"m-1", "m-2"}, messages(got))
	r := got[0]
	require.NotZero(t, r.ID)
	want := outbox.Row{
		ID:           r.ID,
		MessageID:    "m-1",
		Stream:       "order-m-1",
		Category:     "order",
		Type:         "OrderPlaced",
		Data:         in.Data,
		Metadata:     in.Metadata,
		PartitionKey: &key,
		Priority:     2,
		TargetBroker: "default",
		Status:       outbox.StatusProcessing,
		MaxRetries:   outbox.DefaultMaxRetries,
		LockedUntil:  ptr(start.Add(time.Minute)),
		LockedBy:     "relay-1",
		CreatedAt:    start,
	}
	requireSameRow(t, want, r)
	requireSameRow(t, want, get(t, h, r.ID))

	require.Greater(t, got[1].ID, r.ID)
	require.Equal(t, "sales", got[1].Category, "an explicit category is kept")
	require.Equal(t, 7, got[1].MaxRetries, "explicit max retries are kept")
	require.Nil(t, got[1].PartitionKey)

	_, err := h.Store.Get(ctx, r.ID+1000)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

func ptr[T any](v T) *T { return &v }

func testClaimOrder(t *testing.T, h Harness, c *clock) {
	priorities := []int{0, 5, 0, 10, 5, -1, 10}
	var rows []outbox.Row
	for i, p := range priorities {
		rows = append(rows, row(fmt.Sprintf("m-%d", i), p))
	}
	add(t, h, rows...)
	add(t, h, row("m-7", 5), row("m-8", 11))

	got := claim(t, h, "relay-1", 100, time.Minute)
	require.Equal(t, []string{"m-8", "m-3", "m-6", "m-1", "m-4", "m-7", "m-0", "m-2", "m-5"}, messages(got))
	for i := 1; i < len(got); i++ {
		if got[i].Priority == got[i-1].Priority {
			require.Greater(t, got[i].ID, got[i-1].ID, "IDs ascend within a priority")
		}
	}
	require.Empty(t, claim(t, h, "relay-2", 100, time.Minute), "claimed rows are not claimed again")
}

func testClaimLimit(t *testing.T, h Harness, c *clock) {
	for i := range outbox.DefaultClaimLimit + 10 {
		add(t, h, row(fmt.Sprintf("m-%03d", i), 0))
	}
	got := claim(t, h, "relay-1", 3, time.Minute)
	require.Equal(t, []string{"m-000", "m-001", "m-002"}, messages(got))
	got = claim(t, h, "relay-1", 3, time.Minute)
	require.Equal(t, []string{"m-003", "m-004", "m-005"}, messages(got))

	got = claim(t, h, "relay-1", 0, 0)
	require.Len(t, got, outbox.DefaultClaimLimit, "limit <= 0 means the default")
	require.Equal(t, "m-006", got[0].MessageID)
	requireTime(t, start.Add(outbox.DefaultLockFor), got[0].LockedUntil, "lockFor <= 0 means the default")

	got = claim(t, h, "relay-1", -1, -time.Second)
	require.Len(t, got, 4)
	require.Empty(t, claim(t, h, "relay-1", 10, time.Minute))
}

func testConcurrentClaimers(t *testing.T, h Harness, c *clock) {
	const rows = 400
	published := 0
	for _, n := range []int{2, 8, 32} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ctx := t.Context()
			// Fresh rows per level; the previous level's are all published.
			batch := make([]outbox.Row, 0, 50)
			for i := range rows {
				batch = append(batch, row(fmt.Sprintf("m-%d-%d", n, i), i%3))
				if len(batch) == cap(batch) {
					add(t, h, batch...)
					batch = batch[:0]
				}
			}
			gate := make(chan struct{})
			claimed := make([][]int64, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for w := range n {
				wg.Go(func() {
					<-gate
					owner := fmt.Sprintf("relay-%d", w)
					for {
						got, err := h.Store.Claim(ctx, "default", owner, 7, time.Minute)
						if err != nil {
							errs[w] = err
							return
						}
						if len(got) == 0 {
							return
						}
						for _, r := range got {
							if err := h.Store.MarkPublished(ctx, r.ID, owner); err != nil {
								errs[w] = fmt.Errorf("row %d: %w", r.ID, err)
								return
							}
							claimed[w] = append(claimed[w], r.ID)
						}
					}
				})
			}
			close(gate)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			seen := map[int64]int{}
			for w := range n {
				for _, id := range claimed[w] {
					seen[id]++
				}
			}
			require.Len(t, seen, rows, "every row is claimed")
			for id, k := range seen {
				require.Equal(t, 1, k, "row %d claimed %d times", id, k)
			}
			published += rows
			s, err := h.Store.Stats(ctx)
			require.NoError(t, err)
			require.Equal(t, published, s.Counts[outbox.StatusPublished])
			require.Zero(t, s.Counts[outbox.StatusProcessing])
		})
	}
}

func testExpiredLock(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, row("m-1", 0))
	a := claim(t, h, "relay-a", 10, time.Minute)
	require.Len(t, a, 1)
	id := a[0].ID

	c.Advance(time.Minute - time.Microsecond)
	require.Empty(t, claim(t, h, "relay-b", 10, time.Minute), "a lock holds until its expiry instant")
	now := c.Advance(time.Microsecond)
	b := claim(t, h, "relay-b", 10, time.Minute)
	require.Len(t, b, 1, "a lock is free at exactly locked_until")
	require.Equal(t, id, b[0].ID)
	require.Equal(t, "relay-b", b[0].LockedBy)
	requireTime(t, now.Add(time.Minute), b[0].LockedUntil, "locked_until")
	require.Equal(t, 0, b[0].RetryCount, "a reclaim is not a failure")

	// The first owner lost the row: its marks change nothing.
	require.ErrorIs(t, h.Store.MarkPublished(ctx, id, "relay-a"), outbox.ErrNotOwner)
	require.ErrorIs(t, h.Store.MarkFailed(ctx, id, "relay-a", "late", now), outbox.ErrNotOwner)
	requireSameRow(t, b[0], get(t, h, id))

	c.Advance(time.Second)
	require.NoError(t, h.Store.MarkPublished(ctx, id, "relay-b"))
	r := get(t, h, id)
	require.Equal(t, outbox.StatusPublished, r.Status)
	requireTime(t, now.Add(time.Second), r.PublishedAt, "published_at")
	require.Empty(t, r.LockedBy)
	require.Nil(t, r.LockedUntil)
	require.ErrorIs(t, h.Store.MarkPublished(ctx, id, "relay-a"), outbox.ErrNotOwner)

	c.Advance(time.Hour)
	require.Empty(t, claim(t, h, "relay-c", 10, time.Minute), "a published row is never claimed")
}

func testFailedDue(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	r := row("m-1", 0)
	r.MaxRetries = 5
	add(t, h, r)
	id := claimOne(t, h, "relay-a").ID

	due := start.Add(10 * time.Second)
	require.NoError(t, h.Store.MarkFailed(ctx, id, "relay-a", "broker down", due))
	got := get(t, h, id)
	require.Equal(t, outbox.StatusFailed, got.Status)
	require.Equal(t, 1, got.RetryCount)
	require.Equal(t, "broker down", got.LastError)
	requireTime(t, due, got.NextRetryAt, "next_retry_at")
	require.Empty(t, got.LockedBy)
	require.Nil(t, got.LockedUntil)
	require.ErrorIs(t, h.Store.MarkPublished(ctx, id, "relay-a"), outbox.ErrNotOwner, "a failed row is no longer held")

	c.Advance(10*time.Second - time.Microsecond)
	require.Empty(t, claim(t, h, "relay-b", 10, time.Minute), "not due yet")
	c.Advance(time.Microsecond)
	again := claimOne(t, h, "relay-b")
	require.Equal(t, id, again.ID, "due at exactly next_retry_at")
	require.Equal(t, 1, again.RetryCount)
	require.Equal(t, "broker down", again.LastError)
}

func testRetryThenAbandon(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, row("m-1", 0))
	var id int64
	for attempt := 1; attempt <= outbox.DefaultMaxRetries; attempt++ {
		r := claimOne(t, h, "relay")
		require.Equal(t, attempt-1, r.RetryCount)
		id = r.ID
		delay := time.Second << (attempt - 1) // the relay's backoff, without jitter
		require.NoError(t, h.Store.MarkFailed(ctx, id, "relay", fmt.Sprintf("error %d", attempt), c.Now().Add(delay)))
		got := get(t, h, id)
		require.Equal(t, attempt, got.RetryCount)
		require.Equal(t, fmt.Sprintf("error %d", attempt), got.LastError)
		if attempt < outbox.DefaultMaxRetries {
			require.Equal(t, outbox.StatusFailed, got.Status)
			c.Advance(delay)
		}
	}
	got := get(t, h, id)
	require.Equal(t, outbox.StatusAbandoned, got.Status)
	require.Equal(t, "error 3", got.LastError, "the last error is kept")
	require.Nil(t, got.NextRetryAt)
	require.Empty(t, got.LockedBy)

	c.Advance(24 * time.Hour)
	require.Empty(t, claim(t, h, "relay", 10, time.Minute), "an abandoned row is never claimed")

	s, err := h.Store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, s.Counts[outbox.StatusAbandoned])
	require.Len(t, s.Abandoned, 1)
	ab := s.Abandoned[0]
	require.Equal(t, id, ab.ID)
	require.Equal(t, "m-1", ab.MessageID)
	require.Equal(t, "default", ab.TargetBroker)
	require.Equal(t, 3, ab.RetryCount)
	require.Equal(t, "error 3", ab.LastError)
	require.True(t, start.Equal(ab.CreatedAt))
}

func testMaxRetries(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	once, twice := row("m-once", 1), row("m-twice", 0)
	once.MaxRetries, twice.MaxRetries = 1, 2
	add(t, h, once, twice)
	got := claim(t, h, "relay", 10, time.Minute)
	require.Equal(t, []string{"m-once", "m-twice"}, messages(got))
	for _, r := range got {
		require.NoError(t, h.Store.MarkFailed(ctx, r.ID, "relay", "nope", start))
	}
	require.Equal(t, outbox.StatusAbandoned, get(t, h, got[0].ID).Status, "the failure that reaches max retries abandons")
	require.Equal(t, outbox.StatusFailed, get(t, h, got[1].ID).Status)

	again := claim(t, h, "relay", 10, time.Minute)
	require.Equal(t, []string{"m-twice"}, messages(again))
	require.NoError(t, h.Store.MarkFailed(ctx, again[0].ID, "relay", "nope", start))
	require.Equal(t, outbox.StatusAbandoned, get(t, h, again[0].ID).Status)
	c.Advance(time.Hour)
	require.Empty(t, claim(t, h, "relay", 10, time.Minute))
}

func testNonOwner(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, row("m-1", 0))
	r := claimOne(t, h, "relay-a")
	for _, owner := range []string{"relay-b", ""} {
		require.ErrorIs(t, h.Store.MarkPublished(ctx, r.ID, owner), outbox.ErrNotOwner)
		require.ErrorIs(t, h.Store.MarkFailed(ctx, r.ID, owner, "x", start), outbox.ErrNotOwner)
	}
	requireSameRow(t, r, get(t, h, r.ID))

	missing := r.ID + 1000
	require.ErrorIs(t, h.Store.MarkPublished(ctx, missing, "relay-a"), outbox.ErrNotFound)
	require.ErrorIs(t, h.Store.MarkFailed(ctx, missing, "relay-a", "x", start), outbox.ErrNotFound)
	require.ErrorIs(t, h.Store.Abandon(ctx, missing, "x"), outbox.ErrNotFound)
	require.ErrorIs(t, h.Store.Retry(ctx, missing), outbox.ErrNotFound)

	// An expired but untaken lock still belongs to its owner.
	c.Advance(time.Hour)
	require.NoError(t, h.Store.MarkPublished(ctx, r.ID, "relay-a"))
}

func testAbandon(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, row("m-1", 2), row("m-2", 1), row("m-3", 0))

	held := claimOne(t, h, "relay-a")
	require.NoError(t, h.Store.Abandon(ctx, held.ID, "Invalid partition key: empty"))
	got := get(t, h, held.ID)
	require.Equal(t, outbox.StatusAbandoned, got.Status)
	require.Equal(t, "Invalid partition key: empty", got.LastError)
	require.Empty(t, got.LockedBy)
	require.Nil(t, got.LockedUntil)
	require.ErrorIs(t, h.Store.MarkPublished(ctx, held.ID, "relay-a"), outbox.ErrNotOwner, "the holder lost it")

	failed := claimOne(t, h, "relay-a")
	require.NoError(t, h.Store.MarkFailed(ctx, failed.ID, "relay-a", "boom", start.Add(time.Minute)))
	require.NoError(t, h.Store.Abandon(ctx, failed.ID, "operator"))
	got = get(t, h, failed.ID)
	require.Equal(t, outbox.StatusAbandoned, got.Status)
	require.Equal(t, "operator", got.LastError)
	require.Nil(t, got.NextRetryAt)

	published := claimOne(t, h, "relay-a")
	require.NoError(t, h.Store.MarkPublished(ctx, published.ID, "relay-a"))
	require.ErrorIs(t, h.Store.Abandon(ctx, published.ID, "too late"), outbox.ErrStatus)
	require.Equal(t, outbox.StatusPublished, get(t, h, published.ID).Status)

	c.Advance(time.Hour)
	require.Empty(t, claim(t, h, "relay-a", 10, time.Minute))
}

func testRetryCommand(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	one := row("m-1", 1)
	one.MaxRetries = 1
	add(t, h, one, row("m-2", 0))

	r1 := claimOne(t, h, "relay")
	require.NoError(t, h.Store.MarkFailed(ctx, r1.ID, "relay", "gave up", start))
	require.Equal(t, outbox.StatusAbandoned, get(t, h, r1.ID).Status)
	r2 := claimOne(t, h, "relay")
	require.ErrorIs(t, h.Store.Retry(ctx, r2.ID), outbox.ErrStatus, "a processing row is not retried")

	require.NoError(t, h.Store.Retry(ctx, r1.ID))
	got := get(t, h, r1.ID)
	require.Equal(t, outbox.StatusPending, got.Status)
	require.Zero(t, got.RetryCount)
	require.Nil(t, got.NextRetryAt)
	require.Empty(t, got.LockedBy)
	require.Nil(t, got.LockedUntil)
	require.Equal(t, "gave up", got.LastError, "the last error stays for the record")
	require.ErrorIs(t, h.Store.Retry(ctx, r1.ID), outbox.ErrStatus, "a pending row is not retried")

	again := claimOne(t, h, "relay")
	require.Equal(t, r1.ID, again.ID, "a requeued row is claimable")
	require.NoError(t, h.Store.MarkPublished(ctx, r1.ID, "relay"))
	require.ErrorIs(t, h.Store.Retry(ctx, r1.ID), outbox.ErrStatus, "a published row is not retried")

	// A failed row waiting for its retry time is requeued at once.
	add(t, h, row("m-3", 5))
	r3 := claimOne(t, h, "relay")
	require.Equal(t, "m-3", r3.MessageID)
	require.NoError(t, h.Store.MarkFailed(ctx, r3.ID, "relay", "later", start.Add(time.Hour)))
	require.Equal(t, outbox.StatusFailed, get(t, h, r3.ID).Status)
	require.NoError(t, h.Store.Retry(ctx, r3.ID))
	got3 := claimOne(t, h, "relay")
	require.Equal(t, r3.ID, got3.ID, "claimable before its old next_retry_at")
	require.Zero(t, got3.RetryCount)
}

func testCleanup(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	gone := row("m-gone", 3)
	gone.MaxRetries = 1
	add(t, h, row("m-pub1", 5), row("m-pub3", 4), gone, row("m-failed", 2), row("m-pending", -1))

	c.Advance(time.Hour)
	pub1 := claimOne(t, h, "relay")
	require.NoError(t, h.Store.MarkPublished(ctx, pub1.ID, "relay"))
	c.Advance(2 * time.Hour)
	pub3 := claimOne(t, h, "relay")
	require.NoError(t, h.Store.MarkPublished(ctx, pub3.ID, "relay"))
	abOld := claimOne(t, h, "relay")
	require.NoError(t, h.Store.MarkFailed(ctx, abOld.ID, "relay", "x", c.Now()))
	failed := claimOne(t, h, "relay")
	require.NoError(t, h.Store.MarkFailed(ctx, failed.ID, "relay", "x", c.Now().Add(time.Hour)))

	// A row created at start+3h, abandoned too.
	late := row("m-late", 0)
	late.MaxRetries = 1
	add(t, h, late)
	rest := claim(t, h, "relay", 10, time.Minute)
	require.Equal(t, []string{"m-late", "m-pending"}, messages(rest))
	abLate, held := rest[0], rest[1]
	require.NoError(t, h.Store.MarkFailed(ctx, abLate.ID, "relay", "x", c.Now()))

	// Bounds are exclusive: a row published at start+3h and one created at
	// start+3h stay.
	n, err := h.Store.Cleanup(ctx, start.Add(3*time.Hour), start.Add(3*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for _, id := range []int64{pub1.ID, abOld.ID} {
		_, err := h.Store.Get(ctx, id)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	}
	for _, id := range []int64{pub3.ID, failed.ID, abLate.ID, held.ID} {
		get(t, h, id)
	}
	n, err = h.Store.Cleanup(ctx, start.Add(3*time.Hour), start.Add(3*time.Hour))
	require.NoError(t, err)
	require.Zero(t, n)

	n, err = h.Store.Cleanup(ctx, start.Add(4*time.Hour), start.Add(4*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 2, n, "only published and abandoned rows are cleaned up")
	get(t, h, failed.ID)
	get(t, h, held.ID)
}

func testStats(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	s, err := h.Store.Stats(ctx)
	require.NoError(t, err)
	for _, st := range []outbox.Status{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusPublished, outbox.StatusFailed, outbox.StatusAbandoned} {
		v, ok := s.Counts[st]
		require.True(t, ok, "counts has %s", st)
		require.Zero(t, v)
	}
	require.Nil(t, s.OldestPending)
	require.Empty(t, s.Abandoned)
	require.Empty(t, s.RelayLeases)

	h3 := row("m-h3", 1)
	h3.MaxRetries = 1
	add(t, h, row("m-h1", 1), row("m-h2", 1), h3, row("m-h4", 1))
	c.Advance(time.Minute)
	add(t, h, row("m-p1", 0))
	c.Advance(time.Minute)
	add(t, h, row("m-p2", 0))

	hs := claim(t, h, "relay", 4, time.Minute)
	require.Equal(t, []string{"m-h1", "m-h2", "m-h3", "m-h4"}, messages(hs))
	require.NoError(t, h.Store.MarkPublished(ctx, hs[1].ID, "relay"))
	require.NoError(t, h.Store.MarkFailed(ctx, hs[2].ID, "relay", "boom", c.Now()))
	require.NoError(t, h.Store.MarkFailed(ctx, hs[3].ID, "relay", "flaky", c.Now().Add(time.Hour)))

	s, err = h.Store.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[outbox.Status]int{
		outbox.StatusPending:    2,
		outbox.StatusProcessing: 1,
		outbox.StatusPublished:  1,
		outbox.StatusFailed:     1,
		outbox.StatusHalted:     0,
		outbox.StatusAbandoned:  1,
	}, s.Counts)
	requireTime(t, start.Add(time.Minute), s.OldestPending, "oldest pending")
	require.Len(t, s.Abandoned, 1)
	require.Equal(t, hs[2].ID, s.Abandoned[0].ID)
	require.Equal(t, "boom", s.Abandoned[0].LastError)
	require.Equal(t, 1, s.Abandoned[0].RetryCount)
}

func testDuplicates(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, row("m-1", 0))

	tx := begin(t, h)
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-5", 0), row("m-1", 0)}), outbox.ErrDuplicate, "exists")
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-2", 0), row("m-2", 0)}), outbox.ErrDuplicate, "twice in one add")
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-3", 0)}))
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-3", 0)}), outbox.ErrDuplicate, "staged in this transaction")
	ext := row("m-1", 0)
	ext.TargetBroker = "external"
	require.NoError(t, tx.Add(ctx, []outbox.Row{ext}), "one row per broker")
	// Nothing of a failed Add was staged.
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-5", 0), row("m-2", 0)}))
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, []string{"m-1", "m-3", "m-5", "m-2"}, messages(claim(t, h, "relay", 10, time.Minute)))
	require.Equal(t, []string{"m-1"}, messages(claimFor(t, h, "external", "relay", 10, time.Minute)))
}

func testTxStaged(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	tx := begin(t, h)
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-1", 0), row("m-2", 0)}))
	require.Empty(t, claim(t, h, "relay", 10, time.Minute), "staged rows are not claimable")
	s, err := h.Store.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, s.Counts[outbox.StatusPending])

	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx.Rollback(ctx), "rollback after commit is a no-op")
	require.Equal(t, []string{"m-1", "m-2"}, messages(claim(t, h, "relay", 10, time.Minute)))
}

func testTxRollback(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	tx := begin(t, h)
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-1", 0)}))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, tx.Rollback(ctx), "rollback twice is a no-op")
	require.Empty(t, claim(t, h, "relay", 10, time.Minute))

	add(t, h, row("m-1", 0)) // the message id is free again
	require.Equal(t, []string{"m-1"}, messages(claim(t, h, "relay", 10, time.Minute)))
}

func testTxDone(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	tx := begin(t, h)
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-1", 0)}))
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-2", 0)}), outbox.ErrTxDone)

	tx = begin(t, h)
	require.NoError(t, tx.Add(ctx, []outbox.Row{row("m-3", 0)}))
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Commit(ctx), outbox.ErrTxDone, "commit after rollback fails")
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-4", 0)}), outbox.ErrTxDone)
	require.Equal(t, []string{"m-1"}, messages(claim(t, h, "relay", 10, time.Minute)))
}

func testInvalidInput(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	for name, mutate := range map[string]func(r *outbox.Row){
		"empty message id":            func(r *outbox.Row) { r.MessageID = "" },
		"empty target broker":         func(r *outbox.Row) { r.TargetBroker = "" },
		"empty stream":                func(r *outbox.Row) { r.Stream = "" },
		"empty type":                  func(r *outbox.Row) { r.Type = "" },
		"negative max":                func(r *outbox.Row) { r.MaxRetries = -1 },
		"data not JSON":               func(r *outbox.Row) { r.Data = json.RawMessage(`{`) },
		"metadata not JSON":           func(r *outbox.Row) { r.Metadata = json.RawMessage(`x`) },
		"data holds NUL":              func(r *outbox.Row) { r.Data = json.RawMessage(`{"s":"\u0000"}`) },
		"metadata holds NUL":          func(r *outbox.Row) { r.Metadata = json.RawMessage(`{"s":"\u0000"}`) },
		"data holds a lone surrogate": func(r *outbox.Row) { r.Data = json.RawMessage(`{"s":"\udc00"}`) },
		"metadata not UTF-8":          func(r *outbox.Row) { r.Metadata = json.RawMessage("{\"s\":\"\xc3\"}") },
		"stream holds NUL":            func(r *outbox.Row) { r.Stream = "order-1\x00" },
		"type not UTF-8":              func(r *outbox.Row) { r.Type = "\xff" },
		"key holds NUL":               func(r *outbox.Row) { r.PartitionKey = ptr("k\x00") },
		"message id not UTF-8":        func(r *outbox.Row) { r.MessageID = "m\xff" },
		"key too long":                func(r *outbox.Row) { r.PartitionKey = ptr(strings.Repeat("é", outbox.MaxPartitionKeyLength+1)) },
		"broker too long":             func(r *outbox.Row) { r.TargetBroker = strings.Repeat("b", outbox.MaxBrokerLength+1) },
	} {
		bad := row("m-bad", 0)
		mutate(&bad)
		tx := begin(t, h)
		require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-ok", 0), bad}), outbox.ErrInvalid, name)
		require.NoError(t, tx.Commit(ctx))
	}
	require.Empty(t, claim(t, h, "relay", 10, time.Minute), "no invalid batch lands")

	_, err := h.Store.Claim(ctx, "default", "", 10, time.Minute)
	require.ErrorIs(t, err, outbox.ErrInvalid, "a claim needs an owner")
	_, err = h.Store.Claim(ctx, "", "relay", 10, time.Minute)
	require.ErrorIs(t, err, outbox.ErrInvalid, "a claim needs a broker")
}

func testCancelledContext(t *testing.T, h Harness, c *clock) {
	add(t, h, row("m-1", 0))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := h.Store.Claim(ctx, "default", "relay", 10, time.Minute)
	require.ErrorIs(t, err, context.Canceled)
	tx := begin(t, h)
	require.ErrorIs(t, tx.Add(ctx, []outbox.Row{row("m-2", 0)}), context.Canceled)
	require.NoError(t, tx.Commit(t.Context()))
	require.Equal(t, []string{"m-1"}, messages(claim(t, h, "relay", 10, time.Minute)))
}

func testRowsAreCopies(t *testing.T, h Harness, c *clock) {
	// (At the column widths exactly, a row is fine.)
	wide := row("m-wide", 0)
	wide.PartitionKey = ptr(strings.Repeat("é", outbox.MaxPartitionKeyLength))
	add(t, h, wide)
	require.Len(t, claim(t, h, "relay", 10, time.Minute), 1)

	key := "k-1"
	in := row("m-1", 0)
	in.PartitionKey = &key
	add(t, h, in)
	in.Data[2] = 'X'
	key = "changed"

	r := claimOne(t, h, "relay")
	requireJSON(t, json.RawMessage(`{"msg": "m-1"}`), r.Data, "data")
	require.Equal(t, "k-1", *r.PartitionKey)
	r.Data[2] = 'Y'
	*r.PartitionKey = "changed"
	*r.LockedUntil = time.Time{}

	got := get(t, h, r.ID)
	requireJSON(t, json.RawMessage(`{"msg": "m-1"}`), got.Data, "data")
	require.Equal(t, "k-1", *got.PartitionKey)
	requireTime(t, start.Add(time.Minute), got.LockedUntil, "locked_until")
}

// keyed is a row of stream with partition key key ("" for none).
func keyed(msg, stream, key string, priority int) outbox.Row {
	r := row(msg, priority)
	r.Stream = stream
	if key != "" {
		r.PartitionKey = &key
	}
	return r
}

func testClaimPerBroker(t *testing.T, h Harness, c *clock) {
	ext := row("m-2", 0)
	ext.TargetBroker = "external"
	add(t, h, row("m-1", 0), ext, row("m-3", 0))
	require.Equal(t, []string{"m-1", "m-3"}, messages(claim(t, h, "relay", 10, time.Minute)))
	require.Equal(t, []string{"m-2"}, messages(claimFor(t, h, "external", "relay", 10, time.Minute)))
	require.Empty(t, claimFor(t, h, "other", "relay", 10, time.Minute))
}

// held is how many rows of a key one relay holds.
type held struct {
	owner string
	rows  int
}

// testRacingClaimersPerKey lets relays race over rows of a few keys: at no
// moment are two rows of one key out with relays, and each key's rows are
// claimed in ID (commit) order.
func testRacingClaimersPerKey(t *testing.T, h Harness, c *clock) {
	const keys, perKey = 6, 10
	const total = keys * perKey
	for _, n := range []int{2, 8, 32} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want := addKeyedRows(t, h, n, keys, perKey)
			r := &keyRace{t: t, h: h, ctx: t.Context(), total: total,
				inflight: map[string]held{}, got: map[string][]string{}, progress: make(chan struct{})}
			r.run(n)
			require.False(t, t.Failed())
			require.Equal(t, want, r.got, "each key's rows are claimed once each, in commit order")
		})
	}
}

// addKeyedRows adds perKey rows of each of keys keys for the round of n
// relays and returns each key's messages in commit order.
func addKeyedRows(t *testing.T, h Harness, n, keys, perKey int) map[string][]string {
	want := map[string][]string{}
	var batch []outbox.Row
	// Key by key, so that a store that ignores keys hands one relay
	// several rows of a key at once.
	for k := range keys {
		for i := range perKey {
			key := fmt.Sprintf("key-%d-%d", n, k)
			msg := fmt.Sprintf("m-%d-%d-%d", n, k, i)
			// Each row in a stream of its own: the key alone orders them.
			batch = append(batch, keyed(msg, fmt.Sprintf("order-%d-%d-%d", n, k, i), key, 0))
			want[key] = append(want[key], msg)
		}
		if len(batch) >= 2*keys {
			add(t, h, batch...)
			batch = batch[:0]
		}
	}
	add(t, h, batch...)
	return want
}

// keyRace is one round of testRacingClaimersPerKey: what the relays hold
// and have claimed, guarded by mu.
type keyRace struct {
	t     *testing.T
	h     Harness
	ctx   context.Context
	total int

	mu        sync.Mutex
	inflight  map[string]held
	got       map[string][]string
	published int
	stop      bool
	progress  chan struct{}
}

// signal wakes waiting relays; mu is held.
func (r *keyRace) signal() {
	close(r.progress)
	r.progress = make(chan struct{})
}

// fail stops the race (once) and reports err.
func (r *keyRace) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stop {
		r.stop = true
		r.signal()
	}
	r.t.Error(err)
}

// run releases n relays at once and waits for them all.
func (r *keyRace) run(n int) {
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			<-gate
			r.relay(fmt.Sprintf("relay-%d", w))
		})
	}
	close(gate)
	wg.Wait()
}

// relay claims and publishes rows as owner until every row is published
// or the race stops.
func (r *keyRace) relay(owner string) {
	for {
		r.mu.Lock()
		if r.stop || r.published == r.total {
			r.mu.Unlock()
			return
		}
		wait := r.progress
		r.mu.Unlock()
		rows, err := r.h.Store.Claim(r.ctx, "default", owner, 3, time.Minute)
		if err != nil {
			r.fail(err)
			return
		}
		if len(rows) == 0 {
			// Every claimable row is out; wait for a publish.
			select {
			case <-wait:
			case <-time.After(10 * time.Second):
				r.fail(fmt.Errorf("%s: no progress for 10s", owner))
				return
			}
			continue
		}
		if !r.take(owner, rows) || !r.publish(owner, rows) {
			return
		}
	}
}

// take records rows as out with owner, failing the race if another relay
// holds a row of one of their keys.
func (r *keyRace) take(owner string, rows []outbox.Row) bool {
	r.mu.Lock()
	for _, row := range rows {
		k := *row.PartitionKey
		if other, out := r.inflight[k]; out && other.owner != owner {
			r.mu.Unlock()
			r.fail(fmt.Errorf("%s and %s hold rows of key %s at once", other.owner, owner, k))
			return false
		}
		r.inflight[k] = held{owner: owner, rows: r.inflight[k].rows + 1}
		r.got[k] = append(r.got[k], row.MessageID)
	}
	r.mu.Unlock()
	return true
}

// publish hands back owner's rows one by one and marks each published,
// waking waiting relays after each.
func (r *keyRace) publish(owner string, rows []outbox.Row) bool {
	for _, row := range rows {
		r.mu.Lock()
		if h := r.inflight[*row.PartitionKey]; h.rows == 1 {
			delete(r.inflight, *row.PartitionKey)
		} else {
			r.inflight[*row.PartitionKey] = held{owner: owner, rows: h.rows - 1}
		}
		r.mu.Unlock()
		if err := r.h.Store.MarkPublished(r.ctx, row.ID, owner); err != nil {
			r.fail(fmt.Errorf("row %d: %w", row.ID, err))
			return false
		}
		r.mu.Lock()
		r.published++
		r.signal()
		r.mu.Unlock()
	}
	return true
}

func testFailingRowHoldsBackItsKey(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, keyed("a1", "order-1", "A", 0), keyed("b1", "order-2", "B", 0))
	add(t, h, keyed("a2", "order-3", "A", 0), keyed("b2", "order-4", "B", 0))
	add(t, h, keyed("a3", "order-1", "A", 0))
	ids := map[string]int64{}
	claimed := func(owner string) []string {
		t.Helper()
		rows := claim(t, h, owner, 10, time.Minute)
		for _, r := range rows {
			ids[r.MessageID] = r.ID
		}
		return messages(rows)
	}

	require.Equal(t, []string{"a1", "b1", "a2", "b2", "a3"}, claimed("relay"), "each key's ready run, in commit order")
	// a1 fails: the relay gives back the rest of its key's run.
	require.NoError(t, h.Store.MarkFailed(ctx, ids["a1"], "relay", "broker down", start.Add(10*time.Second)))
	require.NoError(t, h.Store.Release(ctx, "relay", []int64{ids["a2"], ids["a3"]}))
	require.NoError(t, h.Store.MarkPublishedBatch(ctx, "relay", []int64{ids["b1"], ids["b2"]}))
	require.Zero(t, get(t, h, ids["a2"]).RetryCount, "a release is not a failure")
	add(t, h, keyed("c1", "order-5", "C", 0))
	require.Equal(t, []string{"c1"}, claimed("relay"), "other keys flow while a1 waits for its retry")
	require.NoError(t, h.Store.MarkPublished(ctx, ids["c1"], "relay"))
	require.Empty(t, claimed("relay"), "a2 and a3 wait behind the failed a1")

	c.Advance(10 * time.Second)
	require.Equal(t, []string{"a1", "a2", "a3"}, claimed("relay"), "the retry comes first, its run behind it")
	require.NoError(t, h.Store.MarkPublishedBatch(ctx, "relay", []int64{ids["a1"], ids["a2"], ids["a3"]}))
	require.Empty(t, claimed("relay"))

	// An abandoned row holds nothing back: abandoned by an operator…
	add(t, h, keyed("e1", "order-6", "E", 0), keyed("e2", "order-7", "E", 0))
	require.Equal(t, []string{"e1", "e2"}, claimed("relay"))
	require.NoError(t, h.Store.MarkFailed(ctx, ids["e1"], "relay", "broker down", c.Now().Add(time.Hour)))
	require.NoError(t, h.Store.Release(ctx, "relay", []int64{ids["e2"]}))
	require.Empty(t, claimed("relay"))
	require.NoError(t, h.Store.Abandon(ctx, ids["e1"], "operator"))
	require.Equal(t, []string{"e2"}, claimed("relay"))
	require.NoError(t, h.Store.MarkPublished(ctx, ids["e2"], "relay"))

	// …or, without a partition key, by its last failure.
	one := keyed("d1", "order-8", "", 0)
	one.MaxRetries = 1
	add(t, h, one, keyed("d2", "order-8", "", 0))
	require.Equal(t, []string{"d1", "d2"}, claimed("relay"))
	require.NoError(t, h.Store.MarkFailed(ctx, ids["d1"], "relay", "gave up", c.Now()))
	require.NoError(t, h.Store.Release(ctx, "relay", []int64{ids["d2"]}))
	require.Equal(t, outbox.StatusAbandoned, get(t, h, ids["d1"]).Status)
	require.Equal(t, []string{"d2"}, claimed("relay"))
	require.NoError(t, h.Store.MarkPublished(ctx, ids["d2"], "relay"))

	// A partitioned row's last failure halts it instead: it holds back
	// its key until an operator retries it (it goes first) or skips it.
	for _, op := range []string{"retry", "skip"} {
		h1, h2 := "h1-"+op, "h2-"+op
		head := keyed(h1, "order-10", "H-"+op, 0)
		head.MaxRetries = 1
		add(t, h, head, keyed(h2, "order-11", "H-"+op, 0))
		require.Equal(t, []string{h1, h2}, claimed("relay"))
		require.NoError(t, h.Store.MarkFailed(ctx, ids[h1], "relay", "refused", c.Now()))
		require.NoError(t, h.Store.Release(ctx, "relay", []int64{ids[h2]}))
		require.Equal(t, outbox.StatusHalted, get(t, h, ids[h1]).Status)
		c.Advance(time.Hour)
		require.Empty(t, claimed("relay"), "%s waits behind the halted %s", h2, h1)
		if op == "retry" {
			require.NoError(t, h.Store.Retry(ctx, ids[h1]))
			require.Equal(t, []string{h1, h2}, claimed("relay"), "the retried row goes first")
			require.NoError(t, h.Store.MarkPublishedBatch(ctx, "relay", []int64{ids[h1], ids[h2]}))
		} else {
			require.NoError(t, h.Store.Abandon(ctx, ids[h1], "skipped"))
			require.Equal(t, []string{h2}, claimed("relay"), "the key goes on without the skipped row")
			require.NoError(t, h.Store.MarkPublished(ctx, ids[h2], "relay"))
			err := h.Store.Retry(ctx, ids[h1])
			require.ErrorIs(t, err, outbox.ErrPassed, "its key went on past it: a retry would reach consumers beyond it")
			require.Equal(t, outbox.StatusAbandoned, get(t, h, ids[h1]).Status)
		}
	}
}

// testBatchMarksNeedTheLock pins MarkPublishedBatch and Release: they
// change the rows the caller holds, name the others, and change nothing of
// those.
func testBatchMarksNeedTheLock(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, keyed("m1", "order-1", "", 0), keyed("m2", "order-2", "", 0), keyed("m3", "order-3", "", 0))
	rows := claim(t, h, "relay-a", 2, time.Minute)
	require.Equal(t, []string{"m1", "m2"}, messages(rows))
	third := claim(t, h, "relay-b", 10, time.Minute)
	require.Equal(t, []string{"m3"}, messages(third))

	err := h.Store.MarkPublishedBatch(ctx, "relay-a", []int64{rows[0].ID, third[0].ID})
	require.ErrorIs(t, err, outbox.ErrNotOwner)
	require.ErrorContains(t, err, fmt.Sprint(third[0].ID))
	require.Equal(t, outbox.StatusPublished, get(t, h, rows[0].ID).Status, "the held row is marked")
	require.Equal(t, outbox.StatusProcessing, get(t, h, third[0].ID).Status, "the other is untouched")

	err = h.Store.Release(ctx, "relay-a", []int64{rows[1].ID, third[0].ID})
	require.ErrorIs(t, err, outbox.ErrNotOwner)
	require.Equal(t, outbox.StatusPending, get(t, h, rows[1].ID).Status)
	require.Equal(t, "relay-b", get(t, h, third[0].ID).LockedBy)
	require.NoError(t, h.Store.MarkPublishedBatch(ctx, "relay-a", nil), "nothing to mark")
	require.Equal(t, []string{"m2"}, messages(claim(t, h, "relay-a", 10, time.Minute)), "a released row is claimable at once")
}

// testOrderingKeyParts pins the ordering key: broker, category and
// partition key, or for a row without a key its stream and priority. Rows
// that differ in any part flow independently.
func testOrderingKeyParts(t *testing.T, h Harness, c *clock) {
	// Two rows are held, so their keys are blocked: key A (broker
	// default, category order, priority 0) and stream order-9 (no key).
	add(t, h, keyed("head", "order-1", "A", 0), keyed("s1", "order-9", "", 0))
	require.Equal(t, []string{"head", "s1"}, messages(claim(t, h, "relay", 100, time.Minute)))

	ext := keyed("ext", "order-1", "A", 0)
	ext.TargetBroker = "external"
	add(t, h,
		keyed("held", "order-2", "A", 0),       // same key, another stream: waits
		keyed("lane", "order-3", "A", 5),       // same key, another priority: waits
		keyed("category", "payment-1", "A", 0), // another category
		ext,                                    // another broker
		keyed("s2", "order-9", "", 0),          // no key: its stream orders it, waits
		keyed("s3", "order-8", "", 0),
		keyed("s4", "order-9", "", 5), // no key, another priority
		keyed("k", "order-9", "K", 0), // a key overrides the stream
	)
	require.Equal(t, []string{"s4", "category", "s3", "k"}, messages(claim(t, h, "relay", 100, time.Minute)))
	require.Equal(t, []string{"ext"}, messages(claimFor(t, h, "external", "relay", 100, time.Minute)))
}

// testCrashBeforeMark is a relay that publishes a row and dies before it
// marks it: once the lock expires the row is claimed, and published, again
// (at least once), and the key's later rows still wait for it.
func testCrashBeforeMark(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	add(t, h, keyed("k1", "order-1", "K", 0), keyed("k2", "order-2", "K", 0))
	first := claim(t, h, "relay-a", 10, time.Minute)
	require.Equal(t, []string{"k1", "k2"}, messages(first))
	// relay-a publishes k1 here, then crashes.

	c.Advance(time.Minute - time.Microsecond)
	require.Empty(t, claim(t, h, "relay-b", 10, time.Minute), "the run is still locked")
	c.Advance(time.Microsecond)
	again := claim(t, h, "relay-b", 10, time.Minute)
	require.Equal(t, []string{"k1", "k2"}, messages(again), "the locks expired: the run goes out again, in order")
	require.Equal(t, first[0].ID, again[0].ID)
	require.Zero(t, again[0].RetryCount, "a crash is not a failure")

	require.ErrorIs(t, h.Store.MarkPublished(ctx, first[0].ID, "relay-a"), outbox.ErrNotOwner, "the crashed relay's late mark")
	require.NoError(t, h.Store.MarkPublishedBatch(ctx, "relay-b", []int64{again[0].ID, again[1].ID}))
	require.Empty(t, claim(t, h, "relay-b", 10, time.Minute))
}

// testRepublish pins Republisher: a broker's first epoch requeues nothing;
// later, every row of the broker published at or after since is pending
// again with no retries used (other brokers' rows, older rows, abandoned
// and pending ones untouched), and claims hand them out in commit order;
// a stillLost that says the broker was marked meanwhile changes nothing.
func testRepublish(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	rp, ok := h.Store.(outbox.Republisher)
	require.True(t, ok, "every store can republish")
	lost := func(context.Context) (bool, error) { return true, nil }
	n, first, err := rp.Republish(ctx, "default", "e1", start, outbox.Keep{}, lost)
	require.NoError(t, err)
	require.True(t, first)
	require.Zero(t, n)

	add(t, h, keyed("old", "order-1", "A", 0))
	publish(t, h, "relay")
	c.Advance(time.Hour)
	since := c.Now()
	other := keyed("other", "order-2", "A", 0)
	other.TargetBroker = "elsewhere"
	add(t, h, keyed("a1", "order-3", "A", 0), keyed("a2", "order-4", "A", 0), other)
	publish(t, h, "relay")
	require.Len(t, claimFor(t, h, "elsewhere", "relay", 10, time.Minute), 1)
	add(t, h, keyed("a3", "order-5", "A", 0))

	n, first, err = rp.Republish(ctx, "default", "e2", since, outbox.Keep{}, func(context.Context) (bool, error) { return false, nil })
	require.NoError(t, err)
	require.False(t, first)
	require.Zero(t, n, "marked meanwhile: nothing to do")

	held := claim(t, h, "stale", 10, time.Minute)
	require.Equal(t, []string{"a3"}, messages(held), "a claim in flight when the broker lost its data")
	n, first, err = rp.Republish(ctx, "default", "e3", since, outbox.Keep{}, lost)
	require.NoError(t, err)
	require.False(t, first)
	require.Equal(t, 2, n, "a1 and a2; not the older row, nor another broker's")
	require.ErrorIs(t, h.Store.MarkPublishedBatch(ctx, "stale", []int64{held[0].ID}), outbox.ErrNotOwner,
		"its claim is revoked: a row it published into the lost broker is not marked published")
	got := claim(t, h, "relay", 10, time.Minute)
	require.Equal(t, []string{"a1", "a2", "a3"}, messages(got), "republished ahead of the later row, in commit order")
	for _, r := range got {
		require.Zero(t, r.RetryCount)
		require.Nil(t, r.PublishedAt)
	}
}

// testRepublishKeeps: a republish leaves published the partitioned rows
// every consumer group of their category applied, by the positions of
// their unit on their stream (a lane row by the lane's), and sends the rest
// again: a row one group is behind on, a row of a unit a group never
// claimed, a row of a category no group applies, a row with no key.
func testRepublishKeeps(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	rp := h.Store.(outbox.Republisher)
	lost := func(context.Context) (bool, error) { return true, nil }
	_, first, err := rp.Republish(ctx, "default", "e1", start, outbox.Keep{}, lost)
	require.NoError(t, err)
	require.True(t, first)

	invoice := keyed("invoice-a", "invoice-1", "A", 0)
	add(t, h,
		atGlobal(keyed("a-applied", "order-1", "A", 0), 10),
		atGlobal(keyed("a-behind", "order-2", "A", 0), 11),
		atGlobal(keyed("b-lane-applied", "order-3", "B", -1), 12),
		atGlobal(keyed("b-primary-unread", "order-4", "B", 0), 13),
		atGlobal(invoice, 14),
		atGlobal(row("no-key", 0), 15),
		atGlobal(keyed("c-unclaimed", "order-5", "C", 0), 16),
		atGlobal(keyed("d-other-host-behind", "order-6", "D", 0), 17),
	)
	require.Len(t, publish(t, h, "relay"), 8)

	set := func(group, unit, stream string, pos int64) {
		t.Helper()
		require.NoError(t, h.Positions.Set(ctx, group, unit, stream, pos))
	}
	// Two handlers of order and a process manager correlated over it.
	set("g1", "order:A", "order:A", 10)
	set("g2", "order:A", "order:A", 12)
	set("pm", "pm:A", "order:A", 10)
	for _, g := range []string{"g1", "g2"} {
		set(g, "order:B", "order:B:backfill", 12)
		set(g, "order:B", "order:B", 100)
	}
	set("pm", "pm:B", "order:B:backfill", 20)
	set("g1", "order:C", "order:C", 16)
	set("pm", "pm:C", "order:C", 16)
	// g3 runs only on another host (a rolling reload): not in this host's
	// keep, but its positions count where they are behind on the row's
	// stream. At or past (order:A), or on another source (an event-store
	// subscription's), they do not.
	for _, g := range []string{"g1", "g2"} {
		set(g, "order:D", "order:D", 17)
	}
	set("pm", "pm:D", "order:D", 17)
	set("g3", "order:D", "order:D", 16)
	set("g3", "order:A", "order:A", 10)
	set("g3", "order:A", "order", 1)
	keep := outbox.KeepFor([]partition.Subscription{
		{Group: "g1", Categories: []string{"order"}},
		{Group: "g2", Categories: []string{"order"}},
		{Group: "pm", Categories: []string{"order"}, Correlated: true},
	}, outbox.Lanes{Enabled: true, Threshold: 0, Suffix: "backfill"})

	n, _, err := rp.Republish(ctx, "default", "e2", start, keep, lost)
	require.NoError(t, err)
	require.Equal(t, 6, n)
	got := claim(t, h, "relay", 10, time.Minute)
	require.ElementsMatch(t, []string{"a-behind", "b-primary-unread", "invoice-a", "no-key", "c-unclaimed", "d-other-host-behind"}, messages(got),
		"kept: a-applied (every group at or past it) and b-lane-applied (by the lane's positions); "+
			"d-other-host-behind goes again for g3, which this host does not run")
}

// testKeyOrderAcrossPriorities: the rows of one partition key reach the
// broker in commit order whatever their priorities (they may share a
// partition stream, whose consumers take a message at or below their
// position as applied): a later row of a higher priority is not claimed
// while the limit leaves out its key's earlier row, and in a claim holding
// both the earlier comes first. Before, the later row went out first and
// its partition worker then acked the earlier one unapplied.
func testKeyOrderAcrossPriorities(t *testing.T, h Harness, _ *clock) {
	add(t, h, keyed("a1", "order-1", "A", 0), keyed("a2", "order-2", "A", 5), keyed("b1", "order-3", "B", 5))
	require.Equal(t, []string{"b1"}, messages(claim(t, h, "relay", 2, time.Minute)),
		"a2 is within the limit, a1 is not: a2 waits for it")
	require.Equal(t, []string{"a1", "a2"}, messages(claim(t, h, "other", 10, time.Minute)), "commit order, not priority order")
}

// testClaimChained: ClaimChained gives each row with a key the global position of the newest
// published row of its key before it that goes to the same stream (the
// lane's rows chain apart from the primary stream's when the lanes are on);
// rows not published (pending, abandoned), other keys and other brokers do
// not count; a row without a key, or the first of its key, answers 0.
func testClaimChained(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	ch, ok := h.Store.(outbox.Chainer)
	require.True(t, ok, "every store can chain")
	other := atGlobal(keyed("other-broker", "order-0", "A", 0), 9)
	other.TargetBroker = "elsewhere"
	add(t, h, other,
		atGlobal(keyed("a1", "order-1", "A", 0), 10),
		atGlobal(keyed("a2-lane", "order-2", "A", -1), 11),
		atGlobal(keyed("a3", "order-3", "A", 0), 12),
		atGlobal(keyed("b1", "order-4", "B", 0), 13))
	require.Len(t, publish(t, h, "relay"), 4)
	require.Len(t, claimFor(t, h, "elsewhere", "relay", 10, time.Minute), 1, "published nowhere: not the default broker's")
	add(t, h, atGlobal(keyed("a-abandoned", "order-5", "A", 0), 14))
	abandoned := claimOne(t, h, "relay")
	require.NoError(t, h.Store.Abandon(ctx, abandoned.ID, "skipped"))
	add(t, h,
		atGlobal(keyed("a4", "order-6", "A", 0), 15),
		atGlobal(keyed("a5-lane", "order-7", "A", -1), 16),
		atGlobal(row("no-key", 0), 17),
		atGlobal(keyed("c1", "order-8", "C", 0), 18))
	chained := func(lanes outbox.Lanes) []int64 {
		t.Helper()
		got, err := ch.ClaimChained(ctx, "default", "relay", 10, time.Minute, lanes)
		require.NoError(t, err)
		require.Equal(t, []string{"a4", "no-key", "c1", "a5-lane"}, messages(got), "a claim as Claim's")
		prev := make([]int64, len(got))
		for i, r := range got {
			prev[i] = r.Prev
		}
		require.NoError(t, h.Store.Release(ctx, "relay", idsOf(got)))
		return prev
	}
	require.Equal(t, []int64{12, 0, 0, 11}, chained(outbox.Lanes{Enabled: true, Threshold: 0, Suffix: "backfill"}),
		"a4 after a3 (the abandoned row is not on the stream), a5 after the lane's a2")
	require.Equal(t, []int64{12, 0, 0, 12}, chained(outbox.Lanes{}), "without lanes one stream: a5 after a3")
	for _, r := range claim(t, h, "relay", 10, time.Minute) {
		require.Zero(t, r.Prev, "Claim leaves Prev alone")
	}
}

// A claim finds the one key whose rows are free while another relay holds
// the first rows of every other key: with a few keys, and with more keys
// than the PostgreSQL claim's gate looks at (65) before the free one, the
// last in key order. The other keys' second rows stay behind their heads.
func testClaimBehindHeldKeys(t *testing.T, h Harness, _ *clock) {
	for _, keys := range []int{10, 70} {
		t.Run(fmt.Sprintf("keys=%d", keys), func(t *testing.T) {
			broker := fmt.Sprintf("held-%d", keys)
			var rows []outbox.Row
			for round := range 2 {
				for k := range keys {
					r := keyed(fmt.Sprintf("%s-k%02d-%d", broker, k, round), fmt.Sprintf("order-%d-%d", k, round), fmt.Sprintf("k%02d", k), 0)
					r.TargetBroker = broker
					rows = append(rows, r)
				}
			}
			add(t, h, rows...)
			a := claimFor(t, h, broker, "relay-a", keys-1, time.Minute)
			require.Len(t, a, keys-1, "relay a holds the first row of every key but the last")
			last := fmt.Sprintf("%s-k%02d", broker, keys-1)
			require.Equal(t, []string{last + "-0", last + "-1"}, messages(claimFor(t, h, broker, "relay-b", 50, time.Minute)),
				"relay b gets the free key's rows, and nothing behind a's")
			require.Empty(t, claimFor(t, h, broker, "relay-c", 50, time.Minute))
		})
	}
}

// leaser is the store's RelayLeaser; both stores are one.
func leaser(t *testing.T, h Harness) outbox.RelayLeaser {
	l, ok := h.Store.(outbox.RelayLeaser)
	require.True(t, ok, "%T is not an outbox.RelayLeaser", h.Store)
	return l
}

func hold(t *testing.T, l outbox.RelayLeaser, broker, owner string, leaseFor time.Duration) bool {
	t.Helper()
	held, err := l.HoldRelay(t.Context(), broker, owner, leaseFor)
	require.NoError(t, err)
	return held
}

func testRelayLease(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	l := leaser(t, h)
	require.True(t, hold(t, l, "default", "relay-a", time.Minute), "a broker nobody held")
	require.False(t, hold(t, l, "default", "relay-b", time.Minute), "another owner's live lease")
	require.True(t, hold(t, l, "other", "relay-b", time.Hour), "each broker has its own lease")

	c.Advance(30 * time.Second)
	require.True(t, hold(t, l, "default", "relay-a", time.Minute), "its holder renews it")
	c.Advance(time.Minute - time.Microsecond)
	require.False(t, hold(t, l, "default", "relay-b", time.Minute), "a renewed lease lasts its length from the renewal")
	c.Advance(time.Microsecond)
	require.True(t, hold(t, l, "default", "relay-b", time.Minute), "a lease is free at exactly its expiry instant")
	require.False(t, hold(t, l, "default", "relay-a", time.Minute), "its old holder lost it")

	// A release by another owner changes nothing; its holder's frees it
	// at once.
	require.NoError(t, l.ReleaseRelay(ctx, "default", "relay-a"))
	require.False(t, hold(t, l, "default", "relay-a", time.Minute))
	require.NoError(t, l.ReleaseRelay(ctx, "default", "relay-b"))
	require.True(t, hold(t, l, "default", "relay-a", time.Minute), "a released lease is free")
	require.False(t, hold(t, l, "other", "relay-a", time.Minute), "the other broker's lease is still relay-b's")
	st, err := h.Store.Stats(ctx)
	require.NoError(t, err)
	now := c.Now()
	require.Equal(t, []outbox.RelayLease{
		{Broker: "default", Owner: "relay-a", Expires: now.Add(time.Minute)},
		{Broker: "other", Owner: "relay-b", Expires: start.Add(time.Hour)},
	}, st.RelayLeases, "Stats tells who holds each broker's lease, until when")
	require.NoError(t, l.ReleaseRelay(ctx, "never-held", "relay-a"), "releasing a lease nobody holds")

	for _, bad := range [][2]string{{"", "relay-a"}, {"default", ""}} {
		_, err := l.HoldRelay(ctx, bad[0], bad[1], time.Minute)
		require.ErrorIs(t, err, outbox.ErrInvalid, "hold %q", bad)
		require.ErrorIs(t, l.ReleaseRelay(ctx, bad[0], bad[1]), outbox.ErrInvalid, "release %q", bad)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.HoldRelay(cancelled, "default", "relay-a", time.Minute)
	require.ErrorIs(t, err, context.Canceled)
}

// testRelayLeaseRace: owners that try for a free lease at once (and again
// and again while it is held) leave exactly one holder.
func testRelayLeaseRace(t *testing.T, h Harness, _ *clock) {
	l := leaser(t, h)
	const owners, tries = 8, 20
	var wg sync.WaitGroup
	won := make([]int, owners)
	errs := make(chan error, owners)
	for i := range owners {
		wg.Go(func() {
			for range tries {
				held, err := l.HoldRelay(context.Background(), "default", fmt.Sprintf("relay-%d", i), time.Minute)
				if err != nil {
					errs <- err
					return
				}
				if held {
					won[i]++
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	holders := 0
	for i, n := range won {
		if n > 0 {
			holders++
			require.Equal(t, tries, n, "relay-%d held the lease only some of the time", i)
		}
	}
	require.Equal(t, 1, holders, "holders of one lease: %v", won)
}

// testRelayWakes: a listener hears its broker's wakes, sent by any relay
// on the store.
func testRelayWakes(t *testing.T, h Harness, _ *clock) {
	w, ok := h.Store.(outbox.RelayWaker)
	require.True(t, ok, "%T is not an outbox.RelayWaker", h.Store)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	heard := map[string]chan struct{}{"default": make(chan struct{}, 1000), "other": make(chan struct{}, 1000)}
	for broker, ch := range heard {
		wg.Go(func() {
			err := w.ListenRelayWakes(ctx, broker, nil, func() { ch <- struct{}{} })
			require.ErrorIs(t, err, context.Canceled)
		})
	}
	// A listener may not listen yet when a wake is sent (PostgreSQL drops
	// a notification nobody listens for): wake until heard.
	for _, broker := range []string{"default", "other"} {
		testwait.For(t, broker+"'s wake heard", func() (bool, string) {
			require.NoError(t, w.WakeRelay(ctx, broker))
			return len(heard[broker]) > 0, ""
		})
	}
}
