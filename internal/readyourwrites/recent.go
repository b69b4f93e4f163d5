package readyourwrites

import (
	"encoding/json"
	"sync"

	"github.com/proteanhq/protean-host/eventstore"
)

// recentSlots is how many of the events this process appended last the
// recent cache holds (direct-mapped by global position).
const recentSlots = 1024

// recent holds the category and payload of the events this process
// appended last (Waiter.Appended), by global position: a keyed wait for
// the reader's own event, at the position its command answered, knows
// that event's key without reading the store.
type recent struct {
	mu    sync.Mutex
	slots [recentSlots]recentEvent
}

type recentEvent struct {
	gp       int64
	category string
	data     json.RawMessage
}

func (r *recent) add(events []eventstore.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range events {
		if ev.GlobalPosition <= 0 {
			continue
		}
		s := &r.slots[ev.GlobalPosition%recentSlots]
		if ev.GlobalPosition > s.gp {
			*s = recentEvent{gp: ev.GlobalPosition, category: eventstore.Category(ev.Stream), data: ev.Data}
		}
	}
}

// at is the payload of the event at gp, if it is of category and still
// held.
func (r *recent) at(category string, gp int64) (json.RawMessage, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slots[gp%recentSlots]
	if gp <= 0 || s.gp != gp || s.category != category {
		return nil, false
	}
	return s.data, true
}
