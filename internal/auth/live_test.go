package auth_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
)

// newKeys returns n new API keys.
func newKeys(t *testing.T, n int) []string {
	t.Helper()
	var keys []string
	for range n {
		k, _, err := auth.NewKey()
		require.NoError(t, err)
		keys = append(keys, k)
	}
	return keys
}

// authOf is an authenticator of keys (shop's, write).
func authOf(t *testing.T, keys ...string) *auth.Authenticator {
	t.Helper()
	var conf []auth.Key
	for _, k := range keys {
		conf = append(conf, auth.Key{Tenant: "shop", Role: auth.RoleWrite, SHA256: auth.Hash(k)})
	}
	ks, err := auth.NewKeys(conf)
	require.NoError(t, err)
	return &auth.Authenticator{Keys: ks}
}

func TestLiveNilAndZeroHoldNothing(t *testing.T) {
	var nilLive *auth.Live
	require.Nil(t, nilLive.Load())
	require.False(t, nilLive.Load().Enabled())
	require.Nil(t, (&auth.Live{}).Load())
	a := authOf(t, newKeys(t, 1)...)
	l := auth.NewLive(a)
	require.Same(t, a, l.Load())
	require.Same(t, a, l.Swap(nil))
	require.False(t, l.Load().Enabled())
}

// TestLiveSwapIsWhole hammers a Live with swaps between two sets (keys
// A+B, then B+C) while requests authenticate: each request answers by
// the one set it loaded, never a mix; B, in both, never fails.
func TestLiveSwapIsWhole(t *testing.T) {
	keys := newKeys(t, 3)
	a, b, c := keys[0], keys[1], keys[2]
	ab, bc := authOf(t, a, b), authOf(t, b, c)
	l := auth.NewLive(ab)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if i%2 == 0 {
				l.Store(bc)
			} else {
				l.Store(ab)
			}
		}
	}()
	var bad atomic.Int64
	var checkers sync.WaitGroup
	for range 4 {
		checkers.Add(1)
		go func() {
			defer checkers.Done()
			for range 2000 {
				cur := l.Load()
				_, errA := cur.Authenticate(context.Background(), "Bearer "+a)
				_, errB := cur.Authenticate(context.Background(), "Bearer "+b)
				_, errC := cur.Authenticate(context.Background(), "Bearer "+c)
				okAB := errA == nil && errB == nil && errC != nil
				okBC := errA != nil && errB == nil && errC == nil
				if (cur == ab && !okAB) || (cur == bc && !okBC) {
					bad.Add(1)
				}
			}
		}()
	}
	checkers.Wait()
	stop.Store(true)
	wg.Wait()
	require.Zero(t, bad.Load())
}

func TestKeyChanges(t *testing.T) {
	keys := newKeys(t, 3)
	id := func(k string) string { return auth.KeyID(auth.Hash(k)) }
	added, removed := auth.KeyChanges(authOf(t, keys[0], keys[1]), authOf(t, keys[1], keys[2]))
	require.Equal(t, []string{id(keys[2])}, added)
	require.Equal(t, []string{id(keys[0])}, removed)
	added, removed = auth.KeyChanges(nil, authOf(t, keys[0]))
	require.Equal(t, []string{id(keys[0])}, added)
	require.Empty(t, removed)
	added, removed = auth.KeyChanges(authOf(t, keys[0]), nil)
	require.Empty(t, added)
	require.Equal(t, []string{id(keys[0])}, removed)
}
