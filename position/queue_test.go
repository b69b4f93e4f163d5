package position_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/pipeline"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/position"
)

// TestQueueAdvanceSeveralUnits pins the one statement QueueAdvance sends
// for the fences of several units (a grouped transaction's runs): each
// unit's row moves as the statements one by one would move it, and the
// whole is refused, changing nothing, exactly when one of them would be.
func TestQueueAdvanceSeveralUnits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testserver.PostgresPool(t)
	s := position.NewPostgres(pool, time.Now)
	claim(t, s, "a", "b", "c") // generation 1
	claim(t, s, "c")           // c at generation 2
	queue := func(fences ...position.Fence) error {
		t.Helper()
		return queueAdvance(t, pool, s, fences...)
	}
	fence := func(unit string, gen int64, advance map[string]int64) position.Fence {
		return position.Fence{Group: "g", Unit: unit, Generation: gen, Advance: advance}
	}
	want := func(unit string, positions map[string]int64) {
		t.Helper()
		row, ok, err := s.Get(ctx, "g", unit)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if !maps.Equal(row.Positions, positions) {
			t.Fatalf("%s: positions %v, want %v", unit, row.Positions, positions)
		}
	}
	refused := func(err error) {
		t.Helper()
		if !errors.Is(err, pipeline.ErrRefused) {
			t.Fatalf("got %v, want a refusal", err)
		}
	}
	// Three units, out of order, one of them with a run of two fences
	// (folded into one) and one checking its generation only.
	err := queue(fence("c", 2, map[string]int64{"s": 5}), fence("a", 1, map[string]int64{"s": 3}),
		fence("a", 1, map[string]int64{"s": 4, "t": 1}), fence("b", 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	want("a", map[string]int64{"s": 4, "t": 1})
	want("b", map[string]int64{})
	want("c", map[string]int64{"s": 5})
	// A stale generation among them refuses all.
	refused(queue(fence("a", 1, map[string]int64{"s": 9}), fence("c", 1, map[string]int64{"s": 9})))
	want("a", map[string]int64{"s": 4, "t": 1})
	// A position already applied among them refuses all.
	refused(queue(fence("b", 1, map[string]int64{"s": 9}), fence("c", 2, map[string]int64{"s": 5})))
	want("b", map[string]int64{})
	// A unit's second fence that does not move forward (not folded: a
	// second fold of the unit) refuses all.
	refused(queue(fence("a", 1, map[string]int64{"s": 7}), fence("a", 1, map[string]int64{"s": 6}), fence("b", 1, map[string]int64{"s": 1})))
	want("a", map[string]int64{"s": 4, "t": 1})
	want("b", map[string]int64{})
	// A unit without a row among them refuses all.
	refused(queue(fence("b", 1, map[string]int64{"s": 1}), fence("zz", 1, map[string]int64{"s": 1})))
	want("b", map[string]int64{})
}

// queueAdvance commits fences through s.QueueAdvance in one pipelined
// transaction, as the unit of work does, and returns the reader's error
// (the transaction rolled back when it is not nil).
func queueAdvance(t *testing.T, pool *pgxpool.Pool, s *position.Postgres, fences ...position.Fence) error {
	t.Helper()
	return testserver.Pipelined(t, pool, func(b *pgx.Batch) (func(pgx.BatchResults) error, error) {
		return s.QueueAdvance(b, fences...)
	})
}

// claim claims each of units of group g on s, at its next generation.
func claim(t *testing.T, s *position.Postgres, units ...string) {
	t.Helper()
	for _, u := range units {
		if _, err := s.Claim(context.Background(), "g", u); err != nil {
			t.Fatal(err)
		}
	}
}
