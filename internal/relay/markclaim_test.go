package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/outbox"
)

// countMarks counts the relay's marks: in a round trip of their own
// (MarkPublishedBatch), and carried by a claim (MarkAndClaim).
type countMarks struct {
	*outbox.Postgres
	alone, carried atomic.Int32
}

func (c *countMarks) MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error {
	if len(ids) > 0 {
		c.alone.Add(1)
	}
	return c.Postgres.MarkPublishedBatch(ctx, owner, ids)
}

func (c *countMarks) MarkAndClaim(ctx context.Context, owner string, ids []int64, brk string, limit int, lockFor time.Duration, lanes *outbox.Lanes) ([]outbox.Row, error, error) {
	c.carried.Add(int32(len(ids)))
	return c.Postgres.MarkAndClaim(ctx, owner, ids, brk, limit, lockFor, lanes)
}

func published(t *testing.T, s *outbox.Postgres) int {
	t.Helper()
	st, err := s.Stats(context.Background())
	require.NoError(t, err)
	return st.Counts[outbox.StatusPublished]
}

// The background loop marks a pass's rows with the next pass's claim, one
// round trip instead of two, and every row still goes out once, in its
// key's order, and ends marked.
func TestLoopMarksWithTheNextClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &countMarks{Postgres: outbox.NewPostgres(testserver.PostgresPool(t), nil)}
	var rows []outbox.Row
	for i := 1; i <= 8; i++ {
		k := "A"
		if i%3 == 0 {
			k = "B"
		}
		rows = append(rows, row(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), fmt.Sprintf("order-%s%d", k, i), key(k), 0))
	}
	require.NoError(t, store.Add(ctx, rows))
	b := &fakeBroker{caps: broker.StreamPartitioning}
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, BatchSize: 2, Tick: time.Hour})
	require.NoError(t, r.Start(ctx))
	testwait.True(t, "every row marked published", func() bool { return published(t, store.Postgres) == len(rows) })
	require.NoError(t, r.Stop(ctx))
	require.Zero(t, store.alone.Load(), "no mark took a round trip of its own")
	require.Equal(t, int32(len(rows)), store.carried.Load(), "each row marked once, with a claim")
	var got []string
	for _, m := range b.got {
		got = append(got, m.EventStream)
	}
	require.Equal(t, []string{"order-A1", "order-A2", "order-B3", "order-A4", "order-A5", "order-B6", "order-A7", "order-A8"}, got,
		"each published once, each key in order")
}

// A soft stop during a clean pass returns with the pass's row marked,
// once: by the next pass's claim, or, when the stop comes first, by the
// loop on its way out (pinned on its own by TestLoopMarksWhatItHoldsAtExit).
func TestStopMarksTheLastPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &countMarks{Postgres: outbox.NewPostgres(testserver.PostgresPool(t), nil)}
	require.NoError(t, store.Add(ctx, []outbox.Row{row("00000000-0000-4000-8000-000000000001", "order-1", nil, 0)}))
	b := newHeldBroker()
	r := relay.New(store, relay.Options{Broker: "default", Owner: "r1", Publisher: b, Tick: time.Hour})
	require.NoError(t, r.Start(ctx))
	testwait.Recv(t, "the publish to begin", b.started)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(ctx) }()
	close(b.release)
	require.NoError(t, testwait.Recv(t, "the publish to end", b.ended))
	require.NoError(t, testwait.Recv(t, "Stop to return", stopped))
	require.Equal(t, 1, published(t, store.Postgres), "Stop returned before the last pass's row was marked")
	require.Equal(t, int32(1), store.alone.Load()+store.carried.Load(), "marked once")
}
