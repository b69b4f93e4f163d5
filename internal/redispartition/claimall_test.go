package redispartition_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/position"
)

// countingPositions counts the claims a consumer makes of its store.
type countingPositions struct {
	*position.Memory
	mu        sync.Mutex
	claims    int   // Claim calls
	claimAlls []int // units per ClaimAll call
	failAll   bool  // ClaimAll fails
}

func (p *countingPositions) Claim(ctx context.Context, group, unit string) (position.Row, error) {
	p.mu.Lock()
	p.claims++
	p.mu.Unlock()
	return p.Memory.Claim(ctx, group, unit)
}

func (p *countingPositions) ClaimAll(ctx context.Context, group string, units []string) ([]position.Row, error) {
	p.mu.Lock()
	p.claimAlls = append(p.claimAlls, len(units))
	fail := p.failAll
	p.mu.Unlock()
	if fail {
		return nil, fmt.Errorf("claim all: injected failure")
	}
	return p.Memory.ClaimAll(ctx, group, units)
}

func (p *countingPositions) counts() (int, []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.claims, append([]int(nil), p.claimAlls...)
}

// A consumer that starts with many keys waiting claims their positions
// rows in bulk, not with a round trip each, and still applies every
// message exactly once, in order. Should the bulk claim fail, each worker
// claims its own row and nothing is lost.
func TestStartClaimsItsUnitsInBulk(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("claim_all_fails=%v", fail), func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			const keys = 120
			for k := 0; k < keys; k++ {
				r.pub.publish("order", fmt.Sprintf("c-%d", k), 2)
			}
			store := &countingPositions{Memory: r.store, failAll: fail}
			h := newEffects(r.store)
			start(t, r.consumer("a", h, 2*time.Second, func(o *redispartition.ConsumerOptions) { o.Positions = store }))
			r.waitApplied(h)
			r.requireExactlyOnceInOrder(h)
			claims, all := store.counts()
			bulk := 0
			for _, n := range all {
				bulk += n
			}
			require.NotEmpty(t, all, "the placement claimed in bulk")
			if fail {
				require.Equal(t, keys, claims, "each worker claimed its own row after the bulk claim failed")
				return
			}
			require.Equal(t, keys, bulk+claims, "every unit claimed once")
			require.Less(t, claims, keys/4, "most units claimed in bulk: %d bulk calls %v, %d single claims", len(all), all, claims)
			require.Less(t, len(all), keys/4, "in few calls: %v", all)
			for k := 0; k < keys; k++ {
				row, ok, err := r.store.Get(context.Background(), "proj", fmt.Sprintf("order:c-%d", k))
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, int64(1), row.Generation, "claimed once")
			}
		})
	}
}
