package engine

import (
	"context"

	"github.com/proteanhq/protean-host/delivery"
)

// Handler returns the engine as the handler every delivery source hands
// its runs to: the broker groups (package internal/groups), the partition
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
	_, ok := routeIn(e.Set(), handler, typ)
	return ok
}
