package subscription

import (
	"context"
	"fmt"
	"strconv"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/position"
)

// RetrySource is the source a rerun of the message at global position pos
// advances in the unit's positions row: its own, so that the rerun commits
// its effects once however often it runs (a second commit is ErrApplied),
// without moving the unit's position, which is past it already.
func RetrySource(pos int64) string { return "retry:" + strconv.FormatInt(pos, 10) }

// replayCostShare bounds the share of a worker's time spent reading its
// open failure records: a list that took d is not read again for
// replayCostShare*d (nor within Poll).
const replayCostShare = 10

// replay reads the unit's open failure records (at most once per Poll,
// and at most a tenth of the time: see replayCostShare), rebuilds the
// halted keys, and reruns what an operator released: a record set to
// retry, and the records held behind a key whose head was retried or
// skipped, in position order, stopping a key at its first failure.
//
// The pacing matters because held records accumulate: a key halted for a
// day at one event a second holds 86,400, which take ~200 ms to list on
// PostgreSQL; listed every poll, they took most of the worker's time and
// slowed every other key of the category by as much. Paced, an operator's
// retry or skip is picked up within max(Poll, 10 times the list's cost).
// Between lists the worker's own parks keep its halted keys current.
func (w *worker) replay(soft context.Context) error {
	c := w.c
	now := c.opts.Clock.Now()
	if now.Sub(w.checked) < max(c.opts.Poll, replayCostShare*w.listCost) {
		return nil
	}
	w.checked = now
	open, err := c.opts.Failures.List(c.work, w.sub.Group, w.sub.Unit(), true)
	w.listCost = c.opts.Clock.Now().Sub(now)
	if err != nil {
		return err
	}
	c.opts.Metrics.openFails.WithLabelValues(w.sub.Group, w.sub.Unit()).Set(float64(len(open)))
	halted := map[string]bool{}
	blocked := map[string]bool{} // keys whose head is failed: nothing of theirs runs
	for _, f := range open {
		if soft.Err() != nil {
			return errLost
		}
		if f.Key != "" {
			halted[f.Key] = true
			if blocked[f.Key] {
				continue
			}
		}
		if f.Status == StatusFailed || (f.Status == StatusHeld && f.Key == "") {
			if f.Key != "" {
				blocked[f.Key] = true
			}
			continue
		}
		ok, err := w.rerun(f)
		if err != nil {
			return err
		}
		if !ok && f.Key != "" {
			blocked[f.Key] = true
		}
	}
	for k := range halted {
		if !blocked[k] {
			delete(halted, k) // every record of the key reran: it flows again
		}
	}
	w.haltMu.Lock()
	w.halted = halted
	w.haltMu.Unlock()
	return nil
}

// rerun runs one recorded message again and records the outcome; false
// means it failed again.
func (w *worker) rerun(f Failure) (bool, error) {
	c := w.c
	var evs []eventstore.Event
	var err error
	if w.sub.Category == All {
		evs, err = c.opts.Events.ReadAll(c.work, f.GlobalPosition, 1)
	} else {
		evs, err = c.opts.Events.ReadCategory(c.work, w.sub.Category, f.GlobalPosition, 1)
	}
	if err != nil {
		return false, err
	}
	if len(evs) == 0 || evs[0].GlobalPosition != f.GlobalPosition {
		return false, fmt.Errorf("subscription %s/%s: failure record at %d: event not found", f.Group, f.Unit, f.GlobalPosition)
	}
	_, herr := c.opts.Handler.Handle(c.work, w.batch(RetrySource(f.GlobalPosition), evs))
	switch {
	case herr == nil || position.Applied(herr):
		c.opts.Metrics.message(w.sub, "replayed", 1)
		c.log.Info("subscription: recorded message rerun and committed", "group", f.Group, "unit", f.Unit,
			"global_position", f.GlobalPosition, "message_id", f.MessageID, "status_was", string(f.Status))
		return true, c.opts.Failures.Settle(c.work, f.Group, f.Unit, f.GlobalPosition, f.Attempts+1, w.generation)
	case position.Fenced(herr):
		w.lose()
		return false, errLost
	case c.work.Err() != nil:
		return false, errLost
	}
	if !c.opts.Classify(herr).Message() {
		return false, herr
	}
	c.opts.Metrics.message(w.sub, "retried", 1)
	c.log.Warn("subscription: recorded message failed again", "group", f.Group, "unit", f.Unit,
		"global_position", f.GlobalPosition, "message_id", f.MessageID, "error", herr)
	return false, c.opts.Failures.Resolve(c.work, f.Group, f.Unit, f.GlobalPosition, StatusFailed, f.Attempts+1, herr.Error())
}
