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
// unit's positions row, "{unit}#{slot}/{slots}", so a restart in the
// middle of a batch skips what a slot committed already. Once every slot
// has finished the batch, a fence-only commit moves the unit's own
// position to the batch's last event: the low-water mark, below which
// nothing is uncommitted. A restart resumes after it, re-reads the same
// batch (a category's committed events below a visible one never change)
// and hands each slot only its events above the slot's position. The row
// keeps one source per slot, not per key, so it stays small.

// slotSource names slot i of n in unit's positions row.
func slotSource(unit string, i, n int) string {
	return unit + "#" + strconv.Itoa(i) + "/" + strconv.Itoa(n)
}

// keySlots returns the slot count and positions the worker starts with.
// A batch left unfinished by a previous owner is finished with that
// owner's slot count (its slot positions are above the unit's), so that
// the same keys map to the same slots; otherwise KeyWorkers.
func (w *worker) keySlots(row position.Row) (int, []int64) {
	n := 1
	if w.sub.Partitioned {
		n = max(w.c.opts.KeyWorkers, 1)
	}
	unit := w.sub.Unit()
	for src, p := range row.Positions {
		rest, ok := strings.CutPrefix(src, unit+"#")
		if !ok || p <= w.pos {
			continue
		}
		_, count, _ := strings.Cut(rest, "/")
		if c, err := strconv.Atoi(count); err == nil && c > 0 {
			n = c
		}
	}
	pos := make([]int64, n)
	for i := range pos {
		pos[i] = row.Positions[slotSource(unit, i, n)]
	}
	return n, pos
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
		s := slotOf(w.key(ev), n)
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
			errs[s] = w.runLane(soft, &lane{src: slotSource(w.sub.Unit(), s, n), pos: &w.slotPos[s]}, lanes[s])
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
	if want := max(c.opts.KeyWorkers, 1); n != want && last >= slices.Max(w.slotPos) {
		// The previous owner's batch is finished: from here on, this
		// host's slot count (every slot position is below the mark).
		w.slots, w.slotPos = want, make([]int64, want)
	}
	return nil
}
