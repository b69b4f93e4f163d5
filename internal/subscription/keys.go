package subscription

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/position"
)

// Per-key workers. A partitioned subscription with KeyWorkers > 1 splits
// each batch it reads into KeyWorkers slots by a hash of the partition key
// and runs the slots in parallel, each in position order (so each key in
// order). A slot commits each run's effects with its own source in the
// unit's positions row, "{unit}#{slot}/{slots}@{key field}", so a restart
// in the middle of a batch skips what a slot committed already: the next
// owner finishes that batch with the slot count and key field the source
// names, whatever its own partitioning (a reload or a new plugin version
// may have changed sequential_by), since a slot's position says nothing
// about events mapped to it by another mapping. Once every slot
// has finished the batch, a fence-only commit moves the unit's own
// position to the batch's last event: the low-water mark, below which
// nothing is uncommitted. A restart resumes after it, re-reads the same
// batch (a category's committed events below a visible one never change)
// and hands each slot only its events above the slot's position. The row
// keeps one source per slot, not per key, so it stays small.

// slotSource names slot i of n in unit's positions row, with the key
// field the slots map keys by ("{unit}#{i}/{n}@{field}"; without "@…"
// when the field is not known).
func slotSource(unit string, i, n int, field string) string {
	s := unit + "#" + strconv.Itoa(i) + "/" + strconv.Itoa(n)
	if field != "" {
		s += "@" + field
	}
	return s
}

// slotting is this owner's own key mapping: KeyWorkers slots by the
// subscription's key field (one slot, sequential, when unpartitioned).
func (w *worker) slotting() {
	n := w.ownSlots()
	w.slots, w.slotPos, w.slotField = n, make([]int64, n), w.sub.KeyField
	w.slotSrc = make([]string, n)
	for i := range n {
		w.slotSrc[i] = slotSource(w.sub.Unit(), i, n, w.slotField)
	}
}

// keySlots sets the slots the worker starts with. A batch left unfinished
// by a previous owner (its slot positions are above the unit's) is
// finished with that owner's slot count and key field, whatever this
// owner's partitioning: the same keys then map to the same slots, and
// each slot skips exactly what it committed. Otherwise this owner's own
// (slotting). A previous owner that did not record its field (an older
// host) is taken to have keyed by this owner's.
func (w *worker) keySlots(row position.Row) {
	w.slotting()
	unit := w.sub.Unit()
	for src, p := range row.Positions {
		rest, ok := strings.CutPrefix(src, unit+"#")
		if !ok || p <= w.pos {
			continue
		}
		rest, field, recorded := strings.Cut(rest, "@")
		_, count, _ := strings.Cut(rest, "/")
		c, err := strconv.Atoi(count)
		if err != nil || c < 1 {
			continue
		}
		if !recorded {
			field = w.sub.KeyField
		}
		w.slots, w.slotField = c, field
		w.slotPos, w.slotSrc = make([]int64, c), make([]string, c)
		for i := range c {
			w.slotSrc[i] = unit + "#" + strconv.Itoa(i) + "/" + count
			if recorded {
				w.slotSrc[i] += "@" + field
			}
			w.slotPos[i] = row.Positions[w.slotSrc[i]]
		}
		return
	}
}

// slotKey is the key an event is slotted by: under the slots' field,
// which is a previous owner's while its unfinished batch is finished.
func (w *worker) slotKey(ev eventstore.Event) string {
	if w.slotField == w.sub.KeyField {
		return w.key(ev)
	}
	return w.c.opts.Key(w.slotField, ev.Data)
}

// ownSlots is this owner's slot count (see slotting).
func (w *worker) ownSlots() int {
	if !w.sub.Partitioned {
		return 1
	}
	return max(w.c.opts.KeyWorkers, 1)
}

// Slot returns the key slot of a partition key among n (per-key
// workers): every event of a key goes to the same slot, in order.
func Slot(key string, n int) int { return slotOf(key, n) }

func slotOf(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// handleKeys runs one batch through the key slots in parallel, then
// commits the low-water mark.
func (w *worker) handleKeys(soft context.Context, evs []eventstore.Event) error {
	c, n := w.c, w.slots
	lanes := make([][]eventstore.Event, n)
	for _, ev := range evs {
		s := slotOf(w.slotKey(ev), n)
		if ev.GlobalPosition > w.slotPos[s] {
			lanes[s] = append(lanes[s], ev)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for s := range lanes {
		if len(lanes[s]) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[s] = w.runLane(soft, &lane{src: w.slotSrc[s], pos: &w.slotPos[s]}, lanes[s])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if errors.Is(err, errLost) {
			return errLost
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	last := evs[len(evs)-1].GlobalPosition
	u := &lane{src: w.sub.Unit(), pos: &w.pos, unit: true}
	err := c.opts.Skip(c.work, position.Fence{Group: w.sub.Group, Unit: w.sub.Unit(), Generation: w.generation,
		Advance: map[string]int64{w.sub.Unit(): last}})
	switch {
	case err == nil:
		w.advanced(u, last)
	case position.Fenced(err):
		w.lose()
		return errLost
	case position.Applied(err):
		if err := w.reload(u); err != nil {
			return err
		}
	default:
		return fmt.Errorf("subscription %s/%s: low-water mark %d: %w", w.sub.Group, w.sub.Unit(), last, err)
	}
	if last >= slices.Max(w.slotPos) && (n != w.ownSlots() || w.slotField != w.sub.KeyField) {
		// The previous owner's batch is finished: from here on, this
		// host's slots (every slot position is below the mark).
		w.slotting()
	}
	return nil
}
