package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
)

// MarkAndClaim marks rows published and claims the next ones in one round
// trip; the claim sees the marks, so a marked row's key goes on in the same
// call. A row the caller no longer holds is named (ErrNotOwner) and the
// claim still runs.
func TestPostgresMarkAndClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outbox.NewPostgres(testserver.PostgresPool(t), nil)
	k := func(v string) *string { return &v }
	require.NoError(t, s.Add(ctx, []outbox.Row{
		row("00000000-0000-4000-8000-000000000001", "order-1", k("A"), 0),
		row("00000000-0000-4000-8000-000000000002", "order-2", k("A"), 0),
		row("00000000-0000-4000-8000-000000000003", "order-3", k("B"), 0),
	}))
	held, err := s.ClaimChained(ctx, "default", "r1", 1, time.Minute, outbox.Lanes{})
	require.NoError(t, err)
	require.Len(t, held, 1)
	require.Equal(t, int64(1), held[0].ID)

	lanes := outbox.Lanes{}
	rows, markErr, err := s.MarkAndClaim(ctx, "r1", []int64{held[0].ID, 3}, "default", 10, time.Minute, &lanes)
	require.NoError(t, err)
	require.ErrorIs(t, markErr, outbox.ErrNotOwner, "row 3 was not r1's")
	require.ErrorContains(t, markErr, "[3]")
	var ids []int64
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	require.Equal(t, []int64{2, 3}, ids, "key A's next row is claimed with its head's mark")
	require.Equal(t, int64(9), rows[0].Prev, "row 2 chains to row 1, published in the same call")
	got, err := s.Get(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPublished, got.Status)

	// Nothing to mark: a plain claim (nothing left).
	rows, markErr, err = s.MarkAndClaim(ctx, "r1", nil, "default", 10, time.Minute, nil)
	require.NoError(t, err)
	require.NoError(t, markErr)
	require.Empty(t, rows)

	// A failed call (canceled here, before it is sent) marks nothing.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = s.MarkAndClaim(cctx, "r1", []int64{2, 3}, "default", 10, time.Minute, &lanes)
	require.Error(t, err)
	for _, id := range []int64{2, 3} {
		got, err := s.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusProcessing, got.Status, "row %d", id)
	}
}
