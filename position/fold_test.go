package position

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// fold folds a unit's fences of one generation while every source moves
// forward: it checks where the first fence that names a source moves it
// from and sets where the last one leaves it; a fence of another unit or
// generation, or one that would not move a source forward, stands alone.
func TestFoldFoldsFencesThatMoveForward(t *testing.T) {
	f := func(unit string, gen int64, adv map[string]int64) Fence {
		return Fence{Group: "g", Unit: unit, Generation: gen, Advance: adv}
	}
	got := fold([]Fence{
		f("u", 1, map[string]int64{"a": 1}),
		f("v", 1, map[string]int64{"a": 7}),
		f("u", 1, map[string]int64{"a": 2, "b": 5}),
		f("u", 1, nil),
		f("u", 2, map[string]int64{"a": 3}),
		f("u", 1, map[string]int64{"b": 5}),
		f("u", 1, map[string]int64{"a": 9}),
	})
	require.Equal(t, []folded{
		{Fence: f("u", 1, map[string]int64{"a": 2, "b": 5}), check: map[string]int64{"a": 1, "b": 5}},
		{Fence: f("v", 1, map[string]int64{"a": 7}), check: map[string]int64{"a": 7}},
		{Fence: f("u", 2, map[string]int64{"a": 3}), check: map[string]int64{"a": 3}},
		{Fence: f("u", 1, map[string]int64{"a": 9, "b": 5}), check: map[string]int64{"a": 9, "b": 5}},
	}, got)
}
