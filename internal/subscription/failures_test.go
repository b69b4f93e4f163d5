package subscription_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/position"
)

func failed(pos int64) subscription.Failure {
	return subscription.Failure{Group: "proj", Unit: "order", GlobalPosition: pos, MessageID: "m", Stream: "order-a",
		Type: "Happened", Status: subscription.StatusFailed, Attempts: 1, Error: "boom"}
}

func fence(gen, pos int64) position.Fence {
	return position.Fence{Group: "proj", Unit: "order", Generation: gen, Advance: map[string]int64{"order": pos}}
}

// recordsAt lists the positions of proj/order's failure records.
func recordsAt(t *testing.T, fs subscription.Failures) []int64 {
	t.Helper()
	recs, err := fs.List(t.Context(), "proj", "order", false)
	require.NoError(t, err)
	var out []int64
	for _, f := range recs {
		out = append(out, f.GlobalPosition)
	}
	return out
}

func unitPosition(t *testing.T, ps subscription.Positions) int64 {
	t.Helper()
	row, ok, err := ps.Get(t.Context(), "proj", "order")
	require.NoError(t, err)
	require.True(t, ok)
	return row.Positions["order"]
}

// Park writes a failure record and moves the position in one transaction:
// an owner's park does both; a stale owner's (a newer generation claimed
// the unit) and one whose position was passed already do neither.
func TestFailuresPark(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, h *harness) {
		ctx := t.Context()
		row, err := h.positions.Claim(ctx, "proj", "order")
		require.NoError(t, err)
		old := row.Generation

		require.NoError(t, h.failures.Park(ctx, failed(5), fence(old, 5)))
		require.Equal(t, []int64{5}, recordsAt(t, h.failures))
		require.Equal(t, int64(5), unitPosition(t, h.positions))

		_, err = h.positions.Claim(ctx, "proj", "order") // a new owner
		require.NoError(t, err)
		err = h.failures.Park(ctx, failed(6), fence(old, 6))
		require.ErrorIs(t, err, position.ErrFenced)
		require.Equal(t, []int64{5}, recordsAt(t, h.failures), "a stale owner writes no record")
		require.Equal(t, int64(5), unitPosition(t, h.positions))

		err = h.failures.Park(ctx, failed(3), fence(old+1, 3))
		require.ErrorIs(t, err, position.ErrApplied)
		require.Equal(t, []int64{5}, recordsAt(t, h.failures), "a position passed already writes no record")

		other := fence(old+1, 7)
		other.Unit = "payment"
		require.ErrorIs(t, h.failures.Park(ctx, failed(7), other), subscription.ErrInvalid)
	})
}

// When the record cannot be written, the position does not move either:
// the message is handled again rather than skipped without a record.
func TestPostgresParkIsOneTransaction(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	fs := subscription.NewPostgresFailures(pool)
	ps := position.NewPostgres(pool, nil)
	ctx := t.Context()
	row, err := ps.Claim(ctx, "proj", "order")
	require.NoError(t, err)
	require.NoError(t, fs.Park(ctx, failed(5), fence(row.Generation, 5)))

	_, err = pool.Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
		CREATE TRIGGER refuse BEFORE INSERT ON subscription_failures FOR EACH ROW EXECUTE FUNCTION refuse()`)
	require.NoError(t, err)
	err = fs.Park(ctx, failed(6), fence(row.Generation, 6))
	require.ErrorContains(t, err, "refused by the test")
	require.Equal(t, []int64{5}, recordsAt(t, fs))
	require.Equal(t, int64(5), unitPosition(t, ps), "the move rolled back with the record")

	_, err = pool.Exec(ctx, `DROP TRIGGER refuse ON subscription_failures`)
	require.NoError(t, err)
	require.NoError(t, fs.Park(ctx, failed(6), fence(row.Generation, 6)))
	require.Equal(t, []int64{5, 6}, recordsAt(t, fs))
	require.Equal(t, int64(6), unitPosition(t, ps))
}

// An owner that loses its unit while a message fails (a new generation
// claimed it before the owner parks the message) records nothing: the
// next owner handles the message, and no record says it failed.
func testFencedOwnerParksNothing(t *testing.T, h *harness) {
	subs := []subscription.Subscription{{Group: "proj", Category: "order"}}
	pos := appendEvents(t, h.events, "order", []string{"a"}, 1)
	r := newRecorder(h.uow)
	var first atomic.Bool
	first.Store(true)
	r.setFail(func(_ string, m delivery.Message) error {
		if !first.CompareAndSwap(true, false) {
			return nil
		}
		// Another owner claims the unit between the failure and the park.
		if _, err := h.positions.Claim(t.Context(), "proj", "order"); err != nil {
			return err
		}
		return msgErr{retryable: false}
	})
	h.consumer(t, r, consumerOpts{subs: subs})
	r.waitApplied(t, "proj", pos)
	testwait.For(t, "the position reaches the message", func() (bool, string) {
		row, _, err := h.positions.Get(t.Context(), "proj", "order")
		if err != nil {
			return false, err.Error()
		}
		return row.Positions["order"] == pos[0], fmt.Sprintf("position %d, want %d", row.Positions["order"], pos[0])
	})
	require.Empty(t, recordsAt(t, h.failures), "the stale owner's park wrote no record")
}

// Settle resolves a rerun's record and drops the rerun's source from the
// positions row; an owner fenced out by a newer claim resolves the record
// but leaves the source, which the newer owner may need to see its own
// rerun of the message applied already.
func TestFailuresSettle(t *testing.T) {
	t.Parallel()
	onBoth(t, func(t *testing.T, h *harness) {
		ctx := t.Context()
		row, err := h.positions.Claim(ctx, "proj", "order")
		require.NoError(t, err)
		gen := row.Generation
		for _, p := range []int64{5, 6} {
			require.NoError(t, h.failures.Park(ctx, failed(p), fence(gen, p)))
			_, err := h.uow.CommitFenced(ctx, position.Fence{Group: "proj", Unit: "order", Generation: gen,
				Advance: map[string]int64{subscription.RetrySource(p): p}}) // the rerun
			require.NoError(t, err)
		}
		require.Len(t, retrySources(t, h), 2)

		require.NoError(t, h.failures.Settle(ctx, "proj", "order", 5, 2, gen))
		require.Equal(t, []string{subscription.RetrySource(6)}, retrySources(t, h))
		_, err = h.positions.Claim(ctx, "proj", "order") // a newer owner
		require.NoError(t, err)
		require.NoError(t, h.failures.Settle(ctx, "proj", "order", 6, 2, gen))
		require.Equal(t, []string{subscription.RetrySource(6)}, retrySources(t, h), "a stale owner leaves the source")
		recs, err := h.failures.List(ctx, "proj", "order", false)
		require.NoError(t, err)
		for _, f := range recs {
			require.Equal(t, subscription.StatusResolved, f.Status)
			require.Equal(t, 2, f.Attempts)
		}
		require.Equal(t, int64(6), unitPosition(t, h.positions), "the unit's position is untouched")
		require.ErrorIs(t, h.failures.Settle(ctx, "proj", "order", 7, 1, gen+1), subscription.ErrNotFound)
	})
}
