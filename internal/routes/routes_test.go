package routes_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

func TestMain(m *testing.M) { testserver.Main(m, wasmbuild.Cleanup) }

func examples(t *testing.T) *host.Set {
	t.Helper()
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	set, errs := host.LoadSet(context.Background(), l, wasmbuild.Examples(t), host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, errs)
	t.Cleanup(func() { _ = set.Close(context.Background()) })
	return set
}

// TestTableOfTheExamples: each source's groups and the keys, from one set.
// Every (handler, category) pair is an event-store subscription and, but
// for the partitioned categories when the partition workers run them, a
// broker group; each partitioned category's readers are the partition
// workers' groups.
func TestTableOfTheExamples(t *testing.T) {
	set := examples(t)
	keys := set.Keys()
	require.NotEmpty(t, keys, "the examples partition a category")
	pairs := set.Subscriptions()
	require.NotEmpty(t, pairs)

	all, split := routes.Of(set, false), routes.Of(set, true)
	for c, k := range keys {
		f, ok := all.PartitionField(c)
		require.True(t, ok)
		require.Equal(t, k.Field, f)
	}
	_, ok := all.PartitionField("no-such-category")
	require.False(t, ok)

	require.Len(t, all.Subscriptions(), len(pairs))
	require.Len(t, all.Groups(), len(pairs), "without partition workers, every pair is a broker group")
	var keyed int
	for i, s := range all.Subscriptions() {
		require.Equal(t, pairs[i].Handler, s.Group)
		require.Equal(t, pairs[i].Category, s.Category)
		_, isKeyed := keys[s.Category]
		require.Equal(t, isKeyed, s.Partitioned)
		if isKeyed {
			keyed++
			require.Equal(t, keys[s.Category].Field, s.KeyField)
		}
	}
	require.NotZero(t, keyed)
	require.Len(t, split.Groups(), len(pairs)-keyed, "with partition workers, the partitioned pairs are theirs")
	for _, g := range split.Groups() {
		_, isKeyed := keys[g.Stream]
		require.False(t, isKeyed, "group %+v reads a partitioned category", g)
	}
	var cats int
	for _, p := range split.Partitions() {
		for _, c := range p.Categories {
			_, isKeyed := keys[c]
			require.True(t, isKeyed)
			cats++
		}
	}
	require.Equal(t, keyed, cats, "each partitioned pair is one partition workers' group's category")
}

// TestSwapTellsTheFollowers: a swap makes the new table the running one,
// then calls the followers in order.
func TestSwapTellsTheFollowers(t *testing.T) {
	set := examples(t)
	r := routes.New(set, true)
	before := r.Table()
	var calls []string
	var seen *routes.Table
	r.Follow(func() { calls = append(calls, "first"); seen = r.Table() })
	r.Follow(func() { calls = append(calls, "second") })
	r.Swap(set)
	require.Equal(t, []string{"first", "second"}, calls)
	require.NotSame(t, before, seen, "the followers see the new table")
	require.Same(t, seen, r.Table())
	require.Equal(t, before.Groups(), seen.Groups())
}
