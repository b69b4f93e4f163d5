package loadgen

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The table gives each row's maximum as a ratio of the floor's, the first
// row.
func TestTableRatiosAgainstTheFloor(t *testing.T) {
	rows := []Row{
		{Name: "floor", MaxRate: 400, HalfRate: 200, P50: 2 * time.Millisecond, P99: 9 * time.Millisecond, CmdP50: time.Millisecond, CmdP99: 3 * time.Millisecond},
		{Name: "1 host(s)", MaxRate: 100, HalfRate: 50, P50: 5 * time.Millisecond, P99: 40 * time.Millisecond, Misses: 2, CmdP50: 4 * time.Millisecond, CmdP99: 30 * time.Millisecond},
	}
	got := Table(rows)
	require.Contains(t, got, "| floor | 400 | 1.00× | 1ms / 3ms | 200 | 2ms / 9ms | 0 |")
	require.Contains(t, got, "| 1 host(s) | 100 | 0.25× | 4ms / 30ms | 50 | 5ms / 40ms | 2 |")
}
