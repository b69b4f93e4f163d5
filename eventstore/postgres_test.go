package eventstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/eventstore/storetest"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// postgresTx is the store's view of a pgx transaction plus its commit
// and rollback: a storetest.Tx.
type postgresTx struct {
	*eventstore.PostgresTx
	testserver.PgxTx
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		pool := testserver.PostgresPool(t)
		s := eventstore.NewPostgres(pool)
		return storetest.Harness{
			Store: s,
			Begin: testserver.BeginWith(pool, func(tx pgx.Tx, end testserver.PgxTx) storetest.Tx {
				return postgresTx{PostgresTx: s.Tx(tx), PgxTx: end}
			}),
		}
	})
}

// A PostgreSQL store leaves no trace of a failed append in global
// positions it hands out later, except possibly gaps; and MessageDB's own
// write_message interoperates with it.
func TestPostgresInteroperatesWithWriteMessage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testserver.PostgresPool(t)
	s := eventstore.NewPostgres(pool)
	_, err := s.Append(ctx, []eventstore.NewEvent{{Stream: "order-1", Type: "A", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	var pos int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT message_store.write_message($1, 'order-1', 'B', '{"x":1}', NULL, 0)`, eventstore.NewID()).Scan(&pos))
	require.Equal(t, int64(1), pos)
	_, err = s.Append(ctx, []eventstore.NewEvent{{Stream: "order-1", Type: "C", ExpectedVersion: 0}})
	var ve *eventstore.VersionError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, eventstore.VersionError{Stream: "order-1", Expected: 0, Actual: 1}, *ve)
	evs, err := s.ReadStream(ctx, "order-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.JSONEq(t, `{"x":1}`, string(evs[1].Data))
}

func TestPostgresTxDuplicateIDLeavesTxUsable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testserver.PostgresPool(t)
	s := eventstore.NewPostgres(pool)
	first, err := s.Append(ctx, []eventstore.NewEvent{{Stream: "order-1", Type: "A", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	v := s.Tx(tx)
	_, err = v.Append(ctx, []eventstore.NewEvent{
		{Stream: "payment-1", Type: "B", ExpectedVersion: eventstore.NoStream},
		{ID: first[0].ID, Stream: "order-2", Type: "C", ExpectedVersion: eventstore.AnyVersion},
	})
	require.ErrorIs(t, err, eventstore.ErrDuplicateID)
	ver, err := v.StreamVersion(ctx, "payment-1")
	require.NoError(t, err)
	require.Equal(t, eventstore.NoStream, ver, "nothing of the failed append is left")
	// A single event takes another path; it too fails cleanly.
	_, err = v.Append(ctx, []eventstore.NewEvent{{ID: first[0].ID, Stream: "payment-2", Type: "C", ExpectedVersion: eventstore.NoStream}})
	require.ErrorIs(t, err, eventstore.ErrDuplicateID)
	_, err = v.Append(ctx, []eventstore.NewEvent{{Stream: "payment-1", Type: "B", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	all, err := s.ReadAll(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 2)
}

// Appends to one category commit in global-position order, so a category
// reader never sees an event while an earlier one of the category is still
// uncommitted: every read is a prefix of the final category.
func TestPostgresCategoryReadsHaveNoHoles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testserver.PostgresPool(t)
	s := eventstore.NewPostgres(pool)
	const writers, each = 8, 15
	done := make(chan struct{})
	var reads [][]int64
	readerErr := make(chan error, 1)
	go func() {
		defer close(readerErr)
		for {
			evs, err := s.ReadCategory(ctx, "order", 0, 0)
			if err != nil {
				readerErr <- err
				return
			}
			var seen []int64
			for _, e := range evs {
				seen = append(seen, e.GlobalPosition)
			}
			reads = append(reads, seen)
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for range each {
				// Other categories' appends interleave, consuming positions.
				_, err := s.Append(ctx, []eventstore.NewEvent{
					{Stream: "order-" + string(rune('a'+w)), Type: "A", ExpectedVersion: eventstore.AnyVersion},
					{Stream: "payment-" + string(rune('a'+w)), Type: "B", ExpectedVersion: eventstore.AnyVersion},
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		require.NoError(t, <-errs)
	}
	close(done)
	require.NoError(t, <-readerErr)
	final, err := s.ReadCategory(ctx, "order", 0, 0)
	require.NoError(t, err)
	require.Len(t, final, writers*each)
	for _, r := range reads {
		for i, g := range r {
			require.Equal(t, final[i].GlobalPosition, g, "a read saw position %d before an earlier one of its category", g)
		}
	}
}
