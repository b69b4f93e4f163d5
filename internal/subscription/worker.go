package subscription

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/position"
)

// worker is the owner of one unit while this host holds its lease.
type worker struct {
	c      *Consumer
	sub    Subscription
	cancel context.CancelFunc
	done   chan struct{}

	generation int64
	// pos is the global position committed last (0: none yet).
	pos int64
	// gapAt is the first missing position the worker holds at (0: none),
	// gapSince when it first saw it.
	gapAt    int64
	gapSince time.Time
	// halted are the partition keys with open failure records: their
	// later messages are held behind them. haltMu guards it while key
	// slots run in parallel.
	halted map[string]bool
	haltMu sync.Mutex
	// slots is the number of key slots of the batch in hand (1:
	// sequential), slotPos each slot's last committed position, slotSrc
	// its source in the positions row, slotField the key field the slots
	// map keys by (a previous owner's, while its unfinished batch is
	// finished).
	slots     int
	slotPos   []int64
	slotSrc   []string
	slotField string
	// checked is when the open failure records were last read, listCost
	// how long that took.
	checked  time.Time
	listCost time.Duration
	// lagAt is when the lag gauge was last refreshed (by the worker's own
	// goroutine only: the unit's lane, never a key slot's).
	lagAt time.Time
	// lost is set when the lease or the unit went to another owner: the
	// worker then leaves the lease alone.
	lost atomic.Bool
}

// release gives the lease up when the worker ends without having lost it
// (a stop, a subscription a reload removed, an error), so that another
// host, or this host's next worker, takes over at once.
func (w *worker) release() {
	if w.lost.Load() {
		return
	}
	c := w.c
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.work), c.opts.Heartbeat)
	defer cancel()
	if err := c.opts.Leases.Release(ctx, w.sub.Group, w.sub.Unit(), c.opts.Owner); err != nil {
		c.log.Warn("subscription: release lease", "group", w.sub.Group, "unit", w.sub.Unit(), "error", err)
	}
}

// lose marks the lease lost (not the worker's to release) and counts it
// once: a failed renewal or a fence refused by a newer owner's claim.
func (w *worker) lose() {
	if w.lost.CompareAndSwap(false, true) {
		w.c.opts.Metrics.lease(w.sub.Group, "lost")
	}
}

// errLost: the unit has a newer owner (fenced) or the worker was told to
// stop; it ends without committing more.
var errLost = errors.New("subscription: unit lost or stopping")

// run claims the unit and handles its events until soft ends or the unit
// is lost.
func (w *worker) run(soft context.Context) {
	c, s := w.c, w.sub
	log := c.log.With("group", s.Group, "unit", s.Unit())
	ctx := c.work
	var row position.Row
	for pause := 1; ; pause++ {
		var err error
		row, err = c.opts.Positions.Claim(ctx, s.Group, s.Unit())
		if err == nil {
			break
		}
		c.outage.Fail(fmt.Errorf("claim: %w", err), "group", s.Group, "unit", s.Unit())
		if !w.sleep(soft, c.opts.Retry.InfraPause(pause)) {
			return
		}
	}
	w.generation, w.pos = row.Generation, row.Positions[s.Unit()]
	w.keySlots(row)
	log.Info("subscription: claimed", "generation", w.generation, "position", w.pos)
	failures := 0
	for soft.Err() == nil {
		if err := w.replay(soft); err != nil {
			if errors.Is(err, errLost) {
				break
			}
			failures++
			c.outage.Fail(fmt.Errorf("failure records: %w", err), "group", s.Group, "unit", s.Unit())
			if !w.sleep(soft, c.opts.Retry.InfraPause(failures)) {
				break
			}
			continue
		}
		wake := c.woken()
		evs, err := w.read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			c.outage.Fail(fmt.Errorf("read: %w", err), "group", s.Group, "unit", s.Unit())
			if !w.sleep(soft, c.opts.Retry.InfraPause(failures)) {
				break
			}
			continue
		}
		failures = 0
		evs, holdFor := w.admit(evs)
		if len(evs) == 0 {
			w.lag(ctx)
			wait := c.opts.Poll
			if holdFor > 0 {
				wait = min(wait, holdFor)
			}
			select {
			case <-soft.Done():
			case <-wake:
			case <-c.opts.Clock.After(wait):
			}
			continue
		}
		if err := w.handle(soft, evs); err != nil {
			if !errors.Is(err, errLost) {
				log.Warn("subscription: stopped", "error", err)
			}
			break
		}
		w.lagEvery(ctx)
	}
	log.Info("subscription: released", "generation", w.generation, "position", w.pos)
}

func (w *worker) read(ctx context.Context) ([]eventstore.Event, error) {
	if w.sub.Category == All {
		return w.c.opts.Events.ReadAll(ctx, w.pos+1, w.c.opts.BatchSize)
	}
	return w.c.opts.Events.ReadCategory(ctx, w.sub.Category, w.pos+1, w.c.opts.BatchSize)
}

// admit returns the events that may be handled now, and, when it holds at
// a gap, how long until the gap's timeout.
//
// Only a $all subscription holds: within one category appends commit in
// global position order (the category's advisory lock is held to commit),
// so a category read never sees a position whose predecessors in the
// category are still to commit, and a hole there is a rollback or another
// category's event. Across categories a later position can commit first:
// a hole in $all may still fill. The first read of a fresh subscription
// (no position yet) starts where the store starts: positions below its
// first event are not a gap.
func (w *worker) admit(evs []eventstore.Event) ([]eventstore.Event, time.Duration) {
	if w.sub.Category != All || len(evs) == 0 {
		return evs, 0
	}
	c := w.c
	next := w.pos + 1
	for i, ev := range evs {
		if ev.GlobalPosition == next || (w.pos == 0 && i == 0) {
			next = ev.GlobalPosition + 1
			continue
		}
		if i > 0 {
			return evs[:i], 0 // handle up to the gap; hold there next
		}
		now := c.opts.Clock.Now()
		if w.gapAt != next {
			w.gapAt, w.gapSince = next, now
			c.opts.Metrics.gap(w.sub, "held")
			c.log.Debug("subscription: holding at a gap", "group", w.sub.Group, "unit", w.sub.Unit(),
				"missing_from", next, "next_visible", ev.GlobalPosition)
		}
		if left := c.opts.GapTimeout - now.Sub(w.gapSince); left > 0 {
			return nil, left
		}
		c.opts.Metrics.gap(w.sub, "abandoned")
		c.log.Warn("subscription: gap abandoned after the timeout: positions missing below the next event are skipped",
			"group", w.sub.Group, "unit", w.sub.Unit(), "missing_from", next, "missing_to", ev.GlobalPosition-1,
			"timeout", c.opts.GapTimeout)
		w.gapAt = 0
		next = ev.GlobalPosition + 1
	}
	return evs, 0
}

// handle runs events through the handler in order, parking those of
// halted keys.
func (w *worker) handle(soft context.Context, evs []eventstore.Event) error {
	if w.slots > 1 {
		return w.handleKeys(soft, evs)
	}
	return w.runLane(soft, &lane{src: w.sub.Unit(), pos: &w.pos, unit: true}, evs)
}

// lane is a run of events committed with one source of the positions row:
// the unit's own (sequential), or one key slot's (per-key workers).
type lane struct {
	src string
	// pos is the source's last committed position.
	pos *int64
	// unit says src is the unit's position (metrics follow it).
	unit bool
}

// runLane handles evs in order through l, parking those of halted keys.
func (w *worker) runLane(soft context.Context, l *lane, evs []eventstore.Event) error {
	for len(evs) > 0 {
		j := 0
		for j < len(evs) && !w.isHalted(evs[j]) {
			j++
		}
		if j > 0 {
			n, err := w.runBatch(soft, l, evs[:j])
			if err != nil {
				return err
			}
			evs = evs[n:]
			continue
		}
		if err := w.park(l, evs[0], StatusHeld, 0, "held behind an earlier failure of its key"); err != nil {
			return err
		}
		evs = evs[1:]
	}
	return nil
}

func (w *worker) key(ev eventstore.Event) string {
	if !w.sub.Partitioned {
		return ""
	}
	return w.c.opts.Key(w.sub.KeyField, ev.Data)
}

func (w *worker) isHalted(ev eventstore.Event) bool {
	w.haltMu.Lock()
	defer w.haltMu.Unlock()
	if len(w.halted) == 0 {
		return false
	}
	k := w.key(ev)
	return k != "" && w.halted[k]
}

// runBatch hands evs to the delivery core (delivery.Core.Deliver): the
// one algorithm of every path retries a failing message with the policy's
// backoff and records it (park) past its retries. It returns how many
// events it consumed: all, or up to a recorded failure (its key is halted
// now, so the caller sorts the rest again).
func (w *worker) runBatch(soft context.Context, l *lane, evs []eventstore.Event) (int, error) {
	n, err := w.c.core.Deliver(soft, w.c.work, &run{w: w, l: l, evs: evs}, len(evs))
	switch {
	case errors.Is(err, delivery.ErrLost):
		w.lose()
		return 0, errLost
	case errors.Is(err, delivery.ErrInterrupted):
		return 0, errLost
	}
	return n, err
}

// run is a batch of one lane as the delivery core's unit.
type run struct {
	w   *worker
	l   *lane
	evs []eventstore.Event
	// at and attempts count the failures of the message at index at: an
	// event-store subscription keeps them in memory (a new owner starts
	// again from the first attempt).
	at, attempts int
}

func (r *run) Handle(ctx context.Context, from, to int) (int, error) {
	done, err := r.w.c.opts.Handler.Handle(ctx, r.w.batch(r.l.src, r.evs[from:to]))
	if err != nil && r.l.unit {
		r.w.lagEvery(ctx) // stuck on this message: the backlog grows behind it
	}
	return done, err
}

func (r *run) Handled(_ context.Context, from, to int) error {
	r.w.advanced(r.l, max(*r.l.pos, r.evs[to-1].GlobalPosition))
	r.w.c.opts.Metrics.message(r.w.sub, "ok", to-from)
	return nil
}

func (r *run) Resync(ctx context.Context, i int) (int, error) {
	if err := r.w.reload(r.l); err != nil {
		return 0, err
	}
	k := 0
	for i+k < len(r.evs) && r.evs[i+k].GlobalPosition <= *r.l.pos {
		k++
	}
	return k, nil
}

func (r *run) Charge(_ context.Context, i int) (int, error) {
	if i != r.at {
		r.at, r.attempts = i, 0
	}
	r.attempts++
	r.w.c.opts.Metrics.message(r.w.sub, "retried", 1)
	return r.attempts, nil
}

func (r *run) GiveUp(_ context.Context, i, failures int, cause error) (bool, error) {
	return false, r.w.park(r.l, r.evs[i], StatusFailed, failures, cause.Error())
}

func (r *run) Attrs(i int) []any {
	return []any{"group", r.w.sub.Group, "unit", r.w.sub.Unit(), "global_position", r.evs[i].GlobalPosition, "message_id", r.evs[i].ID}
}

// park records ev as failed (or held behind its key) and moves the
// position past it, in one transaction (Failures.Park): a crash leaves
// both or neither (then the message runs again), and a stale owner writes
// neither.
func (w *worker) park(l *lane, ev eventstore.Event, st Status, attempts int, msg string) error {
	c := w.c
	key := w.key(ev)
	f := Failure{Group: w.sub.Group, Unit: w.sub.Unit(), GlobalPosition: ev.GlobalPosition, MessageID: ev.ID,
		Stream: ev.Stream, Type: ev.Type, Key: key, Status: st, Attempts: attempts, Error: msg}
	err := c.opts.Failures.Park(c.work, f, position.Fence{Group: w.sub.Group, Unit: w.sub.Unit(), Generation: w.generation,
		Advance: map[string]int64{l.src: ev.GlobalPosition}})
	switch {
	case err == nil:
	case position.Fenced(err):
		w.lose()
		return errLost
	case position.Applied(err):
		// An operator moved the position past it: not this owner's to
		// record.
		return w.reload(l)
	default:
		return err
	}
	if st == StatusFailed {
		c.log.Error("subscription: message failed past its retries; recorded for an operator and skipped",
			"group", w.sub.Group, "unit", w.sub.Unit(), "global_position", ev.GlobalPosition, "message_id", ev.ID,
			"type", ev.Type, "key", key, "attempts", attempts, "error", msg)
		c.opts.Metrics.message(w.sub, "failed", 1)
	} else {
		c.opts.Metrics.message(w.sub, "held", 1)
	}
	if key != "" {
		w.haltMu.Lock()
		w.halted[key] = true
		w.haltMu.Unlock()
	}
	w.advanced(l, ev.GlobalPosition)
	return nil
}

func (w *worker) advanced(l *lane, pos int64) {
	*l.pos = pos
	if l.unit {
		w.c.opts.Metrics.position.WithLabelValues(w.sub.Group, w.sub.Unit()).Set(float64(pos))
	}
}

// reload adopts the row's position of l's source after an operator moved
// it.
func (w *worker) reload(l *lane) error {
	row, ok, err := w.c.opts.Positions.Get(w.c.work, w.sub.Group, w.sub.Unit())
	if err != nil {
		return err
	}
	if !ok || row.Generation != w.generation {
		w.lose()
		return errLost
	}
	*l.pos = max(*l.pos, row.Positions[l.src])
	return nil
}

func (w *worker) batch(source string, evs []eventstore.Event) delivery.Batch {
	msgs := make([]delivery.Message, len(evs))
	for i, ev := range evs {
		msgs[i] = delivery.Message{ID: ev.ID, Stream: w.sub.Category, Type: ev.Type, Data: ev.Data, Metadata: ev.Metadata,
			EventStream: ev.Stream, Category: eventstore.Category(ev.Stream), Position: ev.Position,
			GlobalPosition: ev.GlobalPosition, Time: ev.Time, PartitionKey: w.key(ev)}
	}
	return delivery.Batch{Group: w.sub.Group, Unit: w.sub.Unit(), Source: source, Generation: w.generation, Messages: msgs}
}

// lagEvery refreshes the lag gauge at most once per Poll: a subscription
// that is always behind (it never reads an empty batch) or stuck retrying
// a message still shows how far behind it is, not its last idle value.
func (w *worker) lagEvery(ctx context.Context) {
	if w.c.opts.Clock.Now().Sub(w.lagAt) >= w.c.opts.Poll {
		w.lag(ctx)
	}
}

func (w *worker) lag(ctx context.Context) {
	w.lagAt = w.c.opts.Clock.Now()
	if w.c.opts.Head == nil {
		return
	}
	head, err := w.c.opts.Head(ctx, w.sub.Category)
	if err != nil {
		return
	}
	w.c.opts.Metrics.lag.WithLabelValues(w.sub.Group, w.sub.Unit()).Set(float64(max(head-w.pos, 0)))
}

// sleep waits d unless soft ends first; it reports whether to go on.
func (w *worker) sleep(soft context.Context, d time.Duration) bool {
	select {
	case <-soft.Done():
		return false
	case <-w.c.opts.Clock.After(d):
		return true
	}
}
