package unitofwork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// statements counts the statements of the batches a pool sends, by the
// table they update.
type statements struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (s *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, table := range []string{"records", "consumer_positions"} {
		if strings.Contains(d.SQL, "UPDATE "+table) || strings.Contains(d.SQL, "INSERT INTO "+table) {
			s.n[table]++
		}
	}
}

func (s *statements) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n = map[string]int{}
	return n
}

// A run of messages that each update one projection, each with its fence,
// writes the projection once and advances the unit's positions once (the
// run's writes to a record folded into one, its fences of one unit too),
// with the state the messages one by one would leave: the record at one
// version per message with the last message's data, the position at the
// last message's. A write or a fence that does not follow from the ones
// before it in the run is still refused where it stands, the steps before
// it committed.
func TestPostgresCommitRunFoldsWritesAndFences(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := &statements{n: map[string]int{}}
	cfg := testserver.PostgresPool(t).Config()
	cfg.ConnConfig.Tracer = st
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p := unitofwork.NewPostgres(pool)
	u := unitofwork.New(p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3})
	unit, err := p.Positions.Claim(ctx, "g", "u")
	require.NoError(t, err)
	key := record.Key{Kind: string(abi.RecordProjection), Type: "by_client", ID: "c-1"}
	step := func(pos, expected int64) unitofwork.Step {
		return unitofwork.Step{
			Fence: &position.Fence{Group: "g", Unit: "u", Generation: unit.Generation, Advance: map[string]int64{"order": pos}},
			Changes: []unitofwork.Change{{Effects: &abi.Effects{Writes: []abi.Write{{Kind: abi.RecordProjection, Type: "by_client",
				ID: "c-1", ExpectedVersion: expected, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, pos))}}}}},
		}
	}
	state := func() (int64, string, int64) {
		r, err := p.Records.Load(ctx, key)
		require.NoError(t, err)
		row, _, err := p.Positions.Get(ctx, "g", "u")
		require.NoError(t, err)
		return r.Version, string(r.Data), row.Positions["order"]
	}

	var run []unitofwork.Step
	for i := int64(1); i <= 5; i++ {
		run = append(run, step(i, i-1))
	}
	out, err := u.CommitRun(ctx, run)
	require.NoError(t, err)
	require.Len(t, out, 5)
	version, data, pos := state()
	require.Equal(t, int64(5), version)
	require.JSONEq(t, `{"n":5}`, data)
	require.Equal(t, int64(5), pos)
	require.Equal(t, map[string]int{"records": 1, "consumer_positions": 1}, st.take(), "five messages, one write and one advance")

	// Step 8 expects the version before step 7's write: refused, 6 and 7 stay.
	out, err = u.CommitRun(ctx, []unitofwork.Step{step(6, 5), step(7, 6), step(8, 6)})
	require.True(t, unitofwork.Conflict(err), "%v", err)
	require.Len(t, out, 2)
	version, data, pos = state()
	require.Equal(t, []any{int64(7), `{"n":7}`, int64(7)}, []any{version, data, pos}, "the record as written (json keeps its bytes)")

	// A fence behind the one before it in the run is refused as applied.
	st.take()
	out, err = u.CommitRun(ctx, []unitofwork.Step{step(9, 7), step(8, 8)})
	require.ErrorIs(t, err, position.ErrApplied)
	require.Len(t, out, 1)
	version, _, pos = state()
	require.Equal(t, int64(8), version)
	require.Equal(t, int64(9), pos)
}
