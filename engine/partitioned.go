package engine

import (
	"context"
	"sort"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/partition"
)

// PartitionSubscriptions lists the consumer groups the partition workers
// run for the running set (see [PartitionSubscriptions]).
func (e *Engine) PartitionSubscriptions() []partition.Subscription {
	return PartitionSubscriptions(e.Set())
}

// PartitionSubscriptions lists the consumer groups the partition workers
// run for set: every event handler, projector and process manager that
// reads a partitioned category (whether or not it declared sequential_by
// itself: the category's events live on partition streams). A process
// manager with sequential_by = true owns a correlation value across all
// its partitioned categories.
func PartitionSubscriptions(set *host.Set) []partition.Subscription {
	var out []partition.Subscription
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			if h.Kind == abi.KindCommandHandler {
				continue
			}
			seen := map[string]bool{}
			var cats []string
			for _, t := range h.Handles {
				msg, _ := set.Message(t)
				if _, ok := set.PartitionField(msg.Category); ok && !seen[msg.Category] {
					seen[msg.Category] = true
					cats = append(cats, msg.Category)
				}
			}
			if len(cats) == 0 {
				continue
			}
			sort.Strings(cats)
			out = append(out, partition.Subscription{Group: h.Name, Categories: cats,
				Correlated: h.Kind == abi.KindProcessManager && h.SequentialBy.Correlation})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// Handler returns the engine as the handler every delivery source hands
// its runs to: the broker groups (package broker/groups), the partition
// workers and the event-store subscriptions. A batch with a Unit is fenced
// by its generation.
func (e *Engine) Handler() delivery.Handler { return handler{e} }

type handler struct{ e *Engine }

// Handle runs one run of messages through handleRun.
func (h handler) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	return h.e.handleRun(ctx, b)
}

// Handles reports whether the handler named handler handles message type
// typ in the running set.
func (e *Engine) Handles(handler, typ string) bool {
	_, ok := (&loaded{set: e.Set()}).route(handler, typ)
	return ok
}
