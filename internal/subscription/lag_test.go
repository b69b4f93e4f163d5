package subscription_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// The lag gauge follows a subscription that never catches up: here one
// stuck on a message whose commit keeps failing (the database refusing,
// retried without end) behind a backlog. It was set only when a read came
// back empty, so a subscription that is always behind showed no lag at
// all (no series, or its last idle value) while the backlog grew.
func TestLagFollowsASubscriptionThatNeverCatchesUp(t *testing.T) {
	t.Parallel()
	h := memoryHarness(t)
	pos := appendEvents(t, h.events, "order", []string{"a"}, 30)
	stuck := pos[10]
	r := newRecorder(h.uow)
	r.setFail(func(_ string, m delivery.Message) error {
		if m.GlobalPosition == stuck {
			return errors.New("commit failed: connection reset") // not the message's: retried without end
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	head := func(context.Context, string) (int64, error) { return pos[len(pos)-1], nil }
	h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "proj", Category: "order"}},
		metrics: subscription.NewMetrics(reg), head: head})
	r.waitApplied(t, "proj", pos[:10])
	want := float64(pos[len(pos)-1] - pos[9])
	testwait.For(t, "the lag gauge shows the backlog", func() (bool, string) {
		got := metric(t, reg, "protean_subscription_lag", map[string]string{"group": "proj", "unit": "order"})
		return got == want, fmt.Sprintf("lag %v, want %v", got, want)
	})
}
