package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/unitofwork"
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

// Partitions returns the engine as the partition workers' handler.
func (e *Engine) Partitions() partition.Handler { return partitionHandler{e} }

type partitionHandler struct{ e *Engine }

// Handle runs one partition's run of messages through its group's handler
// as one guest call, then commits the effects of every message before the
// first failure, each message atomically with the unit's position advanced
// past it, all in one transaction (unitofwork.CommitRun: group commit; a
// message whose commit fails commits the ones before it, and is the
// failure). Messages of types the handler does not handle advance the
// position without a call. A call that fails as a whole on a run of
// several messages is made again for the first of them alone, so only a
// guilty message is charged. It returns how many messages committed and
// the failure of the next one.
func (p partitionHandler) Handle(ctx context.Context, b partition.Batch) (int, error) {
	e := p.e
	l, err := e.acquire()
	if err != nil {
		return 0, err
	}
	left := false
	defer func() {
		if !left {
			l.users.leave()
		}
	}()
	if e.opts.EventStore && !subscribes(l.set, b.Group, b.Unit) {
		return 0, fmt.Errorf("event-store subscription %s/%s: %w", b.Group, b.Unit, ErrNotSubscribed)
	}
	ctx, cancel := e.owned(ctx)
	defer cancel()
	var route host.Route
	var envs []abi.Envelope
	var idx []int // index in b.Messages of each envelope
	for i, m := range b.Messages {
		r, ok := l.route(b.Group, m.Type)
		if !ok {
			continue
		}
		route = r
		envs = append(envs, e.messageEnvelope(m))
		idx = append(idx, i)
	}
	fail, failErr := len(b.Messages), error(nil)
	var results []result
	if len(envs) > 0 {
		var err error
		results, err = e.call(ctx, l, route, envs)
		if err != nil {
			if len(envs) > 1 && Classify(err) != delivery.Infrastructure {
				// The call failed as a whole (a trap, a timeout, out of
				// memory): which message caused it is unknown. Handle the
				// run up to its first handled message alone, so that only
				// a guilty message is charged; the rest run after it.
				l.users.leave()
				left = true
				return p.Handle(ctx, partition.Batch{Group: b.Group, Unit: b.Unit, Source: b.Source,
					Generation: b.Generation, Messages: b.Messages[:idx[0]+1]})
			}
			fail, failErr, results = idx[0], err, nil
		}
	}
	var changes []unitofwork.Change
	var causes []abi.Envelope
	for j, r := range results {
		if err := r.err; err != nil {
			fail, failErr = idx[j], err
			break
		}
		changes = append(changes, unitofwork.Change{Effects: r.Effects,
			Metadata: causedBy(envs[j], route.Module)})
		causes = append(causes, envs[j])
	}
	if fail == 0 {
		return 0, failErr
	}
	// Group commit: one step per handled message, each atomic, all in
	// one transaction when they all commit. A step's fence advances past
	// its message and the unhandled ones after it (up to the next handled
	// message, or the failure), so a failing step commits exactly the
	// messages before it.
	steps, ends := runSteps(b, fail, idx[:len(changes)], changes)
	committed, err := e.opts.UnitOfWork.CommitRun(ctx, steps)
	if len(changes) > 0 {
		e.opts.Metrics.commit(route, err)
	}
	if err != nil {
		n := len(committed)
		var ke *unitofwork.KeyError
		if errors.As(err, &ke) && n < len(changes) {
			// An event with a rejected key can never commit: a poison
			// message, not a transient failure.
			err = &HandlerError{File: route.Module.File, Handler: route.Handler.Name, Type: causes[n].Type, Kind: abi.ErrorPermanent, Err: err}
		}
		if n == 0 {
			return 0, err
		}
		fail, failErr = ends[n-1], err
		changes = changes[:n]
	}
	for _, m := range b.Messages[:fail] {
		cat := m.Category
		if cat == "" {
			cat = eventstore.Category(m.EventStream)
		}
		e.handledEvent(ctx, b.Group, cat, m.GlobalPosition)
	}
	for j, c := range changes {
		if c.Effects != nil && len(c.Effects.Commands) > 0 {
			e.followUp(ctx, c.Effects.Commands, causes[j])
		}
	}
	return fail, failErr
}

// runSteps makes the steps of a run's commit: one per change (handled[j]
// is its message's index in b.Messages), the fence of each advancing to
// the last global position up to the next handled message (the last: up
// to fail); with no change, one fence-only step over b.Messages[:fail].
// ends[j] is the count of messages step j commits through.
func runSteps(b partition.Batch, fail int, handled []int, changes []unitofwork.Change) ([]unitofwork.Step, []int) {
	fence := func(from, to int) *position.Fence {
		f := &position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation}
		if gp := lastGlobalPosition(b.Messages[from:to]); gp > 0 {
			f.Advance = map[string]int64{b.Source: gp}
		}
		return f
	}
	if len(changes) == 0 {
		return []unitofwork.Step{{Fence: fence(0, fail)}}, []int{fail}
	}
	steps := make([]unitofwork.Step, len(changes))
	ends := make([]int, len(changes))
	from := 0
	for j, c := range changes {
		end := fail
		if j+1 < len(changes) {
			end = handled[j+1]
		}
		steps[j] = unitofwork.Step{Fence: fence(from, end), Changes: []unitofwork.Change{c}}
		ends[j], from = end, end
	}
	return steps, ends
}

func lastGlobalPosition(msgs []broker.Message) int64 {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].GlobalPosition > 0 {
			return msgs[i].GlobalPosition
		}
	}
	return 0
}
