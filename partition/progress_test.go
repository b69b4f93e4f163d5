package partition_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// units is the local workers of a test: the units they run, and how far
// each has committed.
type units map[string]int64

func (u units) Committed(group, unit string) (int64, bool) {
	at, ok := u[group+"/"+unit]
	return at, ok
}

// A key's unit that this process runs answers from its worker; one it
// does not run, a correlated process manager's, or a Progress without
// local workers, does not answer locally.
func TestProgressAnswersFromTheLocalUnit(t *testing.T) {
	t.Parallel()
	r := readyourwrites.Route{Group: "proj", Category: "order", Field: "client_id"}
	local := units{"proj/" + partition.UnitOf("proj", "order", "c-1", false): 42}
	check := (&partition.Progress{Positions: position.NewMemory(nil), Local: local}).Check("proj", 50)
	lc, ok := check.(readyourwrites.LocalCheck)
	require.True(t, ok)

	at, owned := lc.LocalKeyPosition(r, "c-1")
	require.True(t, owned)
	require.EqualValues(t, 42, at)
	_, owned = lc.LocalKeyPosition(r, "c-2")
	require.False(t, owned, "a unit no worker here runs")
	correlated := r
	correlated.Correlated = true
	_, owned = lc.LocalKeyPosition(correlated, "c-1")
	require.False(t, owned, "a correlated unit spans several categories' streams")

	none := (&partition.Progress{Positions: position.NewMemory(nil)}).Check("proj", 50).(readyourwrites.LocalCheck)
	_, owned = none.LocalKeyPosition(r, "c-1")
	require.False(t, owned)
}
