package unitofwork_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// The append statement of several events runs on a generic plan (SET
// LOCAL plan_cache_mode), which must end with its transaction: after a
// unit of work that commits, one refused in the pipeline (rolled back,
// then run step by step) and a run, the pool's one connection plans as
// configured (auto) and is idle, not in a transaction.
func TestPostgresGenericPlanEndsWithTheUnit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, trace := countingPool(t, testserver.PostgresPool(t)) // one connection
	u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Broker: "default", MaxRetries: 3})
	mode := func() string {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "the connection is idle")
		var m string
		require.NoError(t, c.QueryRow(ctx, `SHOW plan_cache_mode`).Scan(&m))
		return m
	}
	at := func(v int64) *int64 { return &v }
	two := func(expected *int64) unitofwork.Change {
		return unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{
			{Stream: "note-1", Type: "A", Data: json.RawMessage(`{}`), ExpectedVersion: expected},
			{Stream: "note-2", Type: "B", Data: json.RawMessage(`{}`)},
		}}}
	}
	_, err := u.Commit(ctx, two(at(abi.NoStream)))
	require.NoError(t, err)
	require.Equal(t, []error{nil}, trace.batches(), "committed in the pipeline")
	require.Equal(t, "auto", mode())

	_, err = u.Commit(ctx, two(at(abi.NoStream))) // note-1 exists now
	require.True(t, unitofwork.Conflict(err), "%v", err)
	require.Error(t, trace.batches()[0], "refused in the pipeline")
	require.Equal(t, "auto", mode())

	_, err = u.CommitRun(ctx, []unitofwork.Step{{Changes: []unitofwork.Change{two(nil)}}, {Changes: []unitofwork.Change{two(nil)}}})
	require.NoError(t, err)
	require.Equal(t, "auto", mode())
}
