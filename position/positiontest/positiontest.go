// Package positiontest is the conformance suite for position.Store
// implementations and their transactions' fenced Advance. Every
// implementation (memory, PostgreSQL) runs it from a test of its own:
//
//	func TestConformance(t *testing.T) {
//		positiontest.Run(t, func(t *testing.T, now func() time.Time) positiontest.Harness { ... })
//	}
//
// The store must read time only from the clock the suite passes in. The
// suite uses only the interfaces below.
package positiontest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/suite"
	"github.com/proteanhq/protean-host/position"
)

// Tx is an effect transaction as the suite drives it: the store's Tx view
// plus the transaction's end.
type Tx interface {
	// Advance checks a fence and stages its positions; a failed Advance
	// stages nothing and the transaction goes on.
	Advance(ctx context.Context, f position.Fence) error
	suite.Tx
}

// Harness is one store under test.
type Harness = suite.Harness[position.Store, Tx]

// Run runs the suite. newHarness is called once per subtest, possibly from
// parallel subtests, with the clock the store must use.
func Run(t *testing.T, newHarness func(t *testing.T, now func() time.Time) Harness) {
	suite.Run(t, map[string]func(t *testing.T, h Harness, c *clock){
		"ClaimCreatesThenBumps":                  testClaim,
		"ClaimAllClaimsEachInOrder":              testClaimAll,
		"AdvanceChecksGenerationAndMonotonicity": testAdvance,
		"SourcesAreIndependent":                  testSources,
		"UnitsAndGroupsAreIndependent":           testUnitsAndGroups,
		"StaleGenerationRejectedAfterNewerClaim": testStale,
		"RollbackLeavesNothing":                  testRollback,
		"FailedAdvanceStagesNothingTxGoesOn":     testFailedAdvance,
		"TxDone":                                 testTxDone,
		"SetMovesByHandWithoutBumping":           testSet,
		"FenceOnlyChecksGeneration":              testFenceOnly,
		"InvalidInput":                           testInvalid,
		"CancelledContext":                       testCancelled,
		"RowsAreCopies":                          testCopies,
		"ConcurrentClaimsGetDistinctGenerations": testConcurrentClaims,
		"OldAndNewOwnerNeverBothApply":           testOwnersRace,
	}, func(t *testing.T, fn func(*testing.T, Harness, *clock)) {
		c := suite.NewClock()
		fn(t, newHarness(t, c.Now), c)
	})
}

// start is where the suite's clock starts.
var start = suite.Start

// clock is the suite's time; it moves only when a test moves it.
type clock = suite.Clock

func begin(t *testing.T, h Harness) Tx {
	t.Helper()
	return suite.Begin(t, h.Begin)
}

// advance runs f in a transaction of its own and returns Advance's error;
// the transaction commits when Advance succeeded.
func advance(t *testing.T, h Harness, f position.Fence) error {
	t.Helper()
	tx := begin(t, h)
	if err := tx.Advance(t.Context(), f); err != nil {
		require.NoError(t, tx.Rollback(t.Context()))
		return err
	}
	require.NoError(t, tx.Commit(t.Context()))
	return nil
}

func fence(group, unit string, gen int64, kv ...any) position.Fence {
	f := position.Fence{Group: group, Unit: unit, Generation: gen, Advance: map[string]int64{}}
	for i := 0; i < len(kv); i += 2 {
		f.Advance[kv[i].(string)] = int64(kv[i+1].(int))
	}
	return f
}

func claim(t *testing.T, h Harness, group, unit string) position.Row {
	t.Helper()
	r, err := h.Store.Claim(t.Context(), group, unit)
	require.NoError(t, err)
	require.Equal(t, group, r.Group)
	require.Equal(t, unit, r.Unit)
	require.NotNil(t, r.Positions)
	return r
}

func get(t *testing.T, h Harness, group, unit string) position.Row {
	t.Helper()
	r, ok, err := h.Store.Get(t.Context(), group, unit)
	require.NoError(t, err)
	require.True(t, ok, "row %s/%s exists", group, unit)
	require.NotNil(t, r.Positions)
	return r
}

func requireFenced(t *testing.T, err error, group, unit string, have, want int64) {
	t.Helper()
	require.ErrorIs(t, err, position.ErrFenced)
	require.True(t, position.Fenced(err))
	require.False(t, position.Applied(err))
	var fe *position.FenceError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, position.FenceError{Group: group, Unit: unit, Have: have, Want: want}, *fe)
}

func requireApplied(t *testing.T, err error, group, unit, source string, have, want int64) {
	t.Helper()
	require.ErrorIs(t, err, position.ErrApplied)
	require.True(t, position.Applied(err))
	require.False(t, position.Fenced(err))
	var ae *position.AppliedError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, position.AppliedError{Group: group, Unit: unit, Source: source, Have: have, Want: want}, *ae)
}

func testClaimAll(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	claim(t, h, "g", "order:c-2")
	rows, err := h.Store.ClaimAll(ctx, "g", []string{"order:c-3", "order:c-2", "order:c-1"})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	for i, want := range []struct {
		unit string
		gen  int64
	}{{"order:c-3", 1}, {"order:c-2", 2}, {"order:c-1", 1}} {
		require.Equal(t, "g", rows[i].Group)
		require.Equal(t, want.unit, rows[i].Unit)
		require.Equal(t, want.gen, rows[i].Generation, want.unit)
		require.NotNil(t, rows[i].Positions)
		require.Equal(t, want.gen, get(t, h, "g", want.unit).Generation)
	}
	// The claim fences the older owner's advances, as Claim does.
	requireFenced(t, advance(t, h, fence("g", "order:c-2", 1, "order-c-2", 1)), "g", "order:c-2", 2, 1)
	require.NoError(t, advance(t, h, fence("g", "order:c-2", 2, "order-c-2", 1)))
	rows, err = h.Store.ClaimAll(ctx, "g", []string{"order:c-2"})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"order-c-2": 1}, rows[0].Positions, "a new owner reads where to resume")

	rows, err = h.Store.ClaimAll(ctx, "g", nil)
	require.NoError(t, err)
	require.Empty(t, rows)

	// Refused whole, before anything is claimed.
	for _, bad := range [][]string{{"order:c-9", "order:c-9"}, {"order:c-9", ""}} {
		_, err = h.Store.ClaimAll(ctx, "g", bad)
		require.ErrorIs(t, err, position.ErrInvalid, "%q", bad)
	}
	_, ok, err := h.Store.Get(ctx, "g", "order:c-9")
	require.NoError(t, err)
	require.False(t, ok)

	// More units than one statement takes: every one claimed, in order.
	many := make([]string, position.ClaimAllChunk*2+10)
	for i := range many {
		many[i] = fmt.Sprintf("order:k-%05d", len(many)-i)
	}
	rows, err = h.Store.ClaimAll(ctx, "h", many)
	require.NoError(t, err)
	require.Len(t, rows, len(many))
	for i, r := range rows {
		require.Equal(t, many[i], r.Unit)
		require.Equal(t, int64(1), r.Generation)
	}
}

func testClaim(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	_, ok, err := h.Store.Get(ctx, "g", "order:c-1")
	require.NoError(t, err)
	require.False(t, ok)

	r := claim(t, h, "g", "order:c-1")
	require.Equal(t, int64(1), r.Generation)
	require.Empty(t, r.Positions)
	require.True(t, start.Equal(r.UpdatedAt), "updated_at %v", r.UpdatedAt)

	require.NoError(t, advance(t, h, fence("g", "order:c-1", 1, "order:c-1", 7)))
	at := c.Advance(time.Second)
	r = claim(t, h, "g", "order:c-1")
	require.Equal(t, int64(2), r.Generation)
	require.Equal(t, map[string]int64{"order:c-1": 7}, r.Positions, "a claim reads the positions it resumes from")
	require.True(t, at.Equal(r.UpdatedAt))
	require.Equal(t, r, get(t, h, "g", "order:c-1"))
}

func testAdvance(t *testing.T, h Harness, c *clock) {
	requireFenced(t, advance(t, h, fence("g", "u", 1, "s", 1)), "g", "u", 0, 1) // no row: fenced
	claim(t, h, "g", "u")
	at := c.Advance(time.Minute)
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 5)))
	r := get(t, h, "g", "u")
	require.Equal(t, map[string]int64{"s": 5}, r.Positions)
	require.Equal(t, int64(1), r.Generation, "advance does not bump the generation")
	require.True(t, at.Equal(r.UpdatedAt))

	requireApplied(t, advance(t, h, fence("g", "u", 1, "s", 5)), "g", "u", "s", 5, 5)
	requireApplied(t, advance(t, h, fence("g", "u", 1, "s", 4)), "g", "u", "s", 5, 4)
	requireFenced(t, advance(t, h, fence("g", "u", 2, "s", 6)), "g", "u", 1, 2)
	// Fenced wins over applied: a stale owner is told it lost the unit.
	requireFenced(t, advance(t, h, fence("g", "u", 2, "s", 1)), "g", "u", 1, 2)
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 6)))
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 100)), "gaps are fine: positions are global")
	require.Equal(t, map[string]int64{"s": 100}, get(t, h, "g", "u").Positions)
}

func testSources(t *testing.T, h Harness, _ *clock) {
	claim(t, h, "g", "u")
	require.NoError(t, advance(t, h, fence("g", "u", 1, "a", 10)))
	require.NoError(t, advance(t, h, fence("g", "u", 1, "b", 3)), "a new source starts from nothing")
	requireApplied(t, advance(t, h, fence("g", "u", 1, "a", 11, "b", 3)), "g", "u", "b", 3, 3)
	require.Equal(t, map[string]int64{"a": 10, "b": 3}, get(t, h, "g", "u").Positions, "a failed advance moves no source")
	require.NoError(t, advance(t, h, fence("g", "u", 1, "a", 11, "b", 4)))
	require.NoError(t, advance(t, h, fence("g", "u", 1, "b", 5)))
	require.Equal(t, map[string]int64{"a": 11, "b": 5}, get(t, h, "g", "u").Positions)
	// Both sources behind: the error names the first in byte order.
	requireApplied(t, advance(t, h, fence("g", "u", 1, "b", 1, "a", 2)), "g", "u", "a", 11, 2)
}

func testUnitsAndGroups(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	claim(t, h, "g1", "u1")
	claim(t, h, "g1", "u1")
	claim(t, h, "g1", "u2")
	claim(t, h, "g2", "u1")
	require.NoError(t, advance(t, h, fence("g1", "u1", 2, "s", 9)))
	require.NoError(t, advance(t, h, fence("g1", "u2", 1, "s", 1)))
	require.NoError(t, advance(t, h, fence("g2", "u1", 1, "s", 1)))
	requireFenced(t, advance(t, h, fence("g2", "u1", 2, "s", 10)), "g2", "u1", 1, 2)

	all, err := h.Store.List(ctx, "")
	require.NoError(t, err)
	type gu struct {
		g, u string
		gen  int64
		s    int64
	}
	var got []gu
	for _, r := range all {
		got = append(got, gu{r.Group, r.Unit, r.Generation, r.Positions["s"]})
	}
	require.Equal(t, []gu{{"g1", "u1", 2, 9}, {"g1", "u2", 1, 1}, {"g2", "u1", 1, 1}}, got)

	g1, err := h.Store.List(ctx, "g1")
	require.NoError(t, err)
	require.Len(t, g1, 2)
	none, err := h.Store.List(ctx, "g3")
	require.NoError(t, err)
	require.Empty(t, none)

	// Byte order, whatever the database collation says.
	claim(t, h, "g3", "b")
	claim(t, h, "g3", "B")
	claim(t, h, "g3", "a:2")
	claim(t, h, "g3", "a-1")
	g3, err := h.Store.List(ctx, "g3")
	require.NoError(t, err)
	var units []string
	for _, r := range g3 {
		units = append(units, r.Unit)
	}
	require.Equal(t, []string{"B", "a-1", "a:2", "b"}, units)
}

func testStale(t *testing.T, h Harness, _ *clock) {
	old := claim(t, h, "g", "u")
	require.NoError(t, advance(t, h, fence("g", "u", old.Generation, "s", 1)))
	newer := claim(t, h, "g", "u")
	require.Equal(t, old.Generation+1, newer.Generation)
	require.Equal(t, int64(1), newer.Positions["s"])
	requireFenced(t, advance(t, h, fence("g", "u", old.Generation, "s", 2)), "g", "u", newer.Generation, old.Generation)
	require.NoError(t, advance(t, h, fence("g", "u", newer.Generation, "s", 2)))
	requireFenced(t, advance(t, h, fence("g", "u", old.Generation, "s", 3)), "g", "u", newer.Generation, old.Generation)
	require.Equal(t, int64(2), get(t, h, "g", "u").Positions["s"])
}

func testRollback(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	claim(t, h, "g", "u")
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 1)))
	before := get(t, h, "g", "u")
	c.Advance(time.Second)
	tx := begin(t, h)
	require.NoError(t, tx.Advance(ctx, fence("g", "u", 1, "s", 2, "t", 1)))
	require.NoError(t, tx.Advance(ctx, fence("g", "u", 1, "s", 3)), "a transaction sees its own advance")
	requireApplied(t, tx.Advance(ctx, fence("g", "u", 1, "s", 3)), "g", "u", "s", 3, 3)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, tx.Rollback(ctx), "a second rollback is a no-op")
	require.Equal(t, before, get(t, h, "g", "u"))
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 2)), "the rolled-back advance left nothing")
}

func testFailedAdvance(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	claim(t, h, "g", "u")
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 5)))
	tx := begin(t, h)
	requireApplied(t, tx.Advance(ctx, fence("g", "u", 1, "t", 1, "s", 5)), "g", "u", "s", 5, 5)
	requireFenced(t, tx.Advance(ctx, fence("g", "u", 2, "t", 1)), "g", "u", 1, 2)
	requireFenced(t, tx.Advance(ctx, fence("g", "missing", 1, "t", 1)), "g", "missing", 0, 1)
	require.NoError(t, tx.Advance(ctx, fence("g", "u", 1, "s", 6)))
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, tx.Rollback(ctx), "rollback after commit is a no-op")
	require.Equal(t, map[string]int64{"s": 6}, get(t, h, "g", "u").Positions, "t never moved")
	_, ok, err := h.Store.Get(ctx, "g", "missing")
	require.NoError(t, err)
	require.False(t, ok, "a fenced advance creates no row")
}

func testTxDone(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	claim(t, h, "g", "u")
	tx := begin(t, h)
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, tx.Advance(ctx, fence("g", "u", 1, "s", 1)), position.ErrTxDone)
	tx = begin(t, h)
	require.NoError(t, tx.Advance(ctx, fence("g", "u", 1, "s", 1)))
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Commit(ctx), position.ErrTxDone)
	require.ErrorIs(t, tx.Advance(ctx, fence("g", "u", 1, "s", 1)), position.ErrTxDone)
	require.Empty(t, get(t, h, "g", "u").Positions)
}

func testSet(t *testing.T, h Harness, c *clock) {
	ctx := t.Context()
	at := c.Advance(time.Hour)
	require.NoError(t, h.Store.Set(ctx, "g", "u", "s", 40))
	r := get(t, h, "g", "u")
	require.Equal(t, int64(0), r.Generation, "a row made by hand has no owner yet")
	require.Equal(t, map[string]int64{"s": 40}, r.Positions)
	require.True(t, at.Equal(r.UpdatedAt))
	requireFenced(t, advance(t, h, fence("g", "u", 1, "s", 41)), "g", "u", 0, 1)

	r = claim(t, h, "g", "u")
	require.Equal(t, int64(1), r.Generation)
	require.Equal(t, map[string]int64{"s": 40}, r.Positions, "a claim resumes from the hand-set position")
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 41)))
	// An operator's skip: forward past a poison message; the owner keeps
	// its generation and goes on from there.
	require.NoError(t, h.Store.Set(ctx, "g", "u", "s", 50))
	require.NoError(t, h.Store.Set(ctx, "g", "u", "t", 2))
	r = get(t, h, "g", "u")
	require.Equal(t, int64(1), r.Generation, "set does not bump the generation")
	require.Equal(t, map[string]int64{"s": 50, "t": 2}, r.Positions)
	requireApplied(t, advance(t, h, fence("g", "u", 1, "s", 45)), "g", "u", "s", 50, 45)
	// A replay: backwards by hand.
	require.NoError(t, h.Store.Set(ctx, "g", "u", "s", 10))
	require.NoError(t, advance(t, h, fence("g", "u", 1, "s", 11)))
	require.Equal(t, map[string]int64{"s": 11, "t": 2}, get(t, h, "g", "u").Positions)
}

func testFenceOnly(t *testing.T, h Harness, _ *clock) {
	claim(t, h, "g", "u")
	require.NoError(t, advance(t, h, position.Fence{Group: "g", Unit: "u", Generation: 1}))
	requireFenced(t, advance(t, h, position.Fence{Group: "g", Unit: "u", Generation: 2}), "g", "u", 1, 2)
	require.Empty(t, get(t, h, "g", "u").Positions)
}

func testInvalid(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	_, err := h.Store.Claim(ctx, "", "u")
	require.ErrorIs(t, err, position.ErrInvalid)
	_, err = h.Store.Claim(ctx, "g", "")
	require.ErrorIs(t, err, position.ErrInvalid)
	_, _, err = h.Store.Get(ctx, "", "u")
	require.ErrorIs(t, err, position.ErrInvalid)
	require.ErrorIs(t, h.Store.Set(ctx, "g", "u", "", 1), position.ErrInvalid)
	require.ErrorIs(t, h.Store.Set(ctx, "g", "u", "s", -1), position.ErrInvalid)
	claim(t, h, "g", "u")
	for _, f := range []position.Fence{
		fence("g", "u", 0, "s", 1),
		fence("g", "u", -1, "s", 1),
		fence("", "u", 1, "s", 1),
		fence("g", "u", 1, "", 1),
		fence("g", "u", 1, "s", -1),
	} {
		require.ErrorIs(t, advance(t, h, f), position.ErrInvalid, "%+v", f)
	}
	require.Empty(t, get(t, h, "g", "u").Positions)
}

func testCancelled(t *testing.T, h Harness, _ *clock) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := h.Store.Claim(ctx, "g", "u")
	require.ErrorIs(t, err, context.Canceled)
	_, _, err = h.Store.Get(ctx, "g", "u")
	require.ErrorIs(t, err, context.Canceled)
	_, err = h.Store.List(ctx, "")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, h.Store.Set(ctx, "g", "u", "s", 1), context.Canceled)
	tx := begin(t, h)
	require.ErrorIs(t, tx.Advance(ctx, fence("g", "u", 1, "s", 1)), context.Canceled)
	require.NoError(t, tx.Rollback(t.Context()))
	_, ok, err := h.Store.Get(t.Context(), "g", "u")
	require.NoError(t, err)
	require.False(t, ok)
}

func testCopies(t *testing.T, h Harness, _ *clock) {
	ctx := t.Context()
	r := claim(t, h, "g", "u")
	r.Positions["s"] = 99
	f := fence("g", "u", 1, "s", 1)
	require.NoError(t, advance(t, h, f))
	f.Advance["s"] = 1000 // the caller's map is not kept
	got := get(t, h, "g", "u")
	require.Equal(t, map[string]int64{"s": 1}, got.Positions)
	got.Positions["s"] = 77
	rows, err := h.Store.List(ctx, "g")
	require.NoError(t, err)
	rows[0].Positions["s"] = 55
	require.Equal(t, map[string]int64{"s": 1}, get(t, h, "g", "u").Positions)
}

// Every claim of a unit gets a generation of its own, however many race.
func testConcurrentClaims(t *testing.T, h Harness, _ *clock) {
	const workers, each = 8, 25
	gens := make([][]int64, workers)
	errs := make([]error, workers)
	startGate := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-startGate
			for range each {
				r, err := h.Store.Claim(context.Background(), "g", "u")
				if err != nil {
					errs[w] = err
					return
				}
				gens[w] = append(gens[w], r.Generation)
			}
		})
	}
	close(startGate)
	wg.Wait()
	seen := make(map[int64]bool)
	for w := range workers {
		require.NoError(t, errs[w])
		for _, g := range gens[w] {
			require.False(t, seen[g], "generation %d handed out twice", g)
			seen[g] = true
		}
	}
	require.Len(t, seen, workers*each)
	for g := int64(1); g <= workers*each; g++ {
		require.True(t, seen[g], "generation %d missing", g)
	}
	require.Equal(t, int64(workers*each), get(t, h, "g", "u").Generation)
}

// An old owner commits message n while a new owner claims the unit and
// tries message n too: exactly one of them applies it, every round. The
// new owner does not trust what its claim read; it always tries, as a
// worker with a wrong view in memory would.
func testOwnersRace(t *testing.T, h Harness, _ *clock) {
	const rounds = 60
	gen := claim(t, h, "g", "u").Generation
	oldWins, newWins := 0, 0
	for n := 1; n <= rounds; n++ {
		oldGen := gen
		var (
			oldErr, newErr, claimErr error
			r                        position.Row
		)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		oldOwner := func() { // commits message n
			<-gate
			tx, err := h.Begin(context.Background())
			if err != nil {
				oldErr = err
				return
			}
			if err := tx.Advance(context.Background(), fence("g", "u", oldGen, "s", n)); err != nil {
				oldErr = err
				_ = tx.Rollback(context.Background())
				return
			}
			oldErr = tx.Commit(context.Background())
		}
		newOwner := func() { // claims the unit and handles message n
			<-gate
			r, claimErr = h.Store.Claim(context.Background(), "g", "u")
			if claimErr != nil {
				return
			}
			tx, err := h.Begin(context.Background())
			if err != nil {
				newErr = err
				return
			}
			if err := tx.Advance(context.Background(), fence("g", "u", r.Generation, "s", n)); err != nil {
				newErr = err
				_ = tx.Rollback(context.Background())
				return
			}
			newErr = tx.Commit(context.Background())
		}
		// Which goroutine the scheduler runs first depends on the order
		// they start in; alternate it so that both owners win rounds.
		if n%2 == 0 {
			wg.Go(oldOwner)
			wg.Go(newOwner)
		} else {
			wg.Go(newOwner)
			wg.Go(oldOwner)
		}
		close(gate)
		wg.Wait()
		require.NoError(t, claimErr)
		gen = r.Generation

		switch {
		case oldErr == nil:
			oldWins++
			require.Equal(t, int64(n), r.Positions["s"], "round %d: the claim came after the old owner's commit", n)
			requireApplied(t, newErr, "g", "u", "s", int64(n), int64(n))
		case newErr == nil:
			newWins++
			requireFenced(t, oldErr, "g", "u", gen, oldGen)
		default:
			require.Failf(t, "nobody applied", "round %d: old %v, new %v", n, oldErr, newErr)
		}
		require.Equal(t, int64(n), get(t, h, "g", "u").Positions["s"], "round %d", n)
	}
	t.Logf("old owner won %d rounds, new owner %d", oldWins, newWins)
	require.Equal(t, rounds, oldWins+newWins)
}
