package subscription_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A batch that an owner with per-key workers left unfinished (one slot
// stuck, the others committed ahead of the unit's low-water mark) is
// finished by the next owner with the first owner's key mapping, also
// when the partitioning changed in between (a new plugin version drops
// sequential_by, or keys its category by another field): each event is
// applied exactly once. The next owner used to map the events by its own
// partitioning, so events the stuck slot had not committed fell into a
// slot whose position was past them (never applied), and events another
// slot had committed were applied again.
func TestUnfinishedKeyBatchSurvivesAPartitioningChange(t *testing.T) {
	t.Parallel()
	for name, next := range map[string]subscription.Subscription{
		"unpartitioned": {Group: "proj", Category: "order"},
		"another field": {Group: "proj", Category: "order", Partitioned: true, KeyField: "L"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			onBoth(t, func(t *testing.T, h *harness) {
				keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
				var pos []int64
				for i := range 30 {
					// K is the first partitioning's key, L another one's.
					data, _ := json.Marshal(map[string]any{"K": keys[i%6], "L": fmt.Sprint("l", i%5)})
					evs, err := h.events.Append(t.Context(), []eventstore.NewEvent{{Stream: "order-" + keys[i%6], Type: "Happened",
						Data: data, ExpectedVersion: eventstore.AnyVersion}})
					require.NoError(t, err)
					pos = append(pos, evs[0].GlobalPosition)
				}
				stuck := pos[5] // k5's first event: its slot sticks there
				r := newRecorder(h.uow)
				r.setFail(func(_ string, m delivery.Message) error {
					if m.GlobalPosition >= stuck && subscription.Slot(keyK(m), 3) == subscription.Slot("k5", 3) {
						return errors.New("database down") // not the message's: retried without end
					}
					return nil
				})
				first := subscription.Subscription{Group: "proj", Category: "order", Partitioned: true, KeyField: "K"}
				c := h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{first}, keyWorkers: 3, batch: 50})
				want := 0
				for i, p := range pos {
					if p < stuck || subscription.Slot(keys[i%6], 3) != subscription.Slot("k5", 3) {
						want++
					}
				}
				testwait.For(t, "the slots but the stuck one applied", func() (bool, string) {
					n := len(r.positions("proj"))
					return n == want, fmt.Sprint(n, " want ", want)
				})
				stop(t, c)

				r.setFail(nil)
				h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{next}, keyWorkers: 2, owner: "host-b"})
				more := appendEvents(t, h.events, "order", []string{"k0", "k1"}, 4)
				all := append(slices.Clone(pos), more...)
				testwait.For(t, "every event applied", func() (bool, string) {
					got := slices.Sorted(slices.Values(r.positions("proj")))
					return len(slices.Compact(got)) == len(all), fmt.Sprintf("%d distinct of %d", len(slices.Compact(got)), len(all))
				})
				require.ElementsMatch(t, all, r.positions("proj"), "each event applied exactly once")
			})
		})
	}
}

func keyK(m delivery.Message) string {
	var v struct{ K string }
	_ = json.Unmarshal(m.Data, &v)
	return v.K
}
