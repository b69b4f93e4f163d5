package readyourwrites

import (
	"sync"
	"time"
)

// marks is what this process's consumers have handled, per consumer group
// and category.
type marks struct {
	mu      sync.Mutex
	groups  map[string]map[string]*handled
	changed chan struct{} // closed and replaced on every mark
}

// handled is one group's progress in one category.
type handled struct {
	// upTo is the watermark: every event of the category at or below it
	// has been handled.
	upTo int64
	// above holds handled positions above upTo not yet walked over.
	above map[int64]struct{}
	// keyed holds, per partition key, the position up to which a keyed
	// check found every event of the key handled (see caughtUp).
	keyed map[string]int64
	// inOrder holds, per partition key, the last of the key's events this
	// process handled where its deliverer applies each key's events in
	// order (Waiter.Mark): every event of the key at or below it is
	// handled.
	inOrder map[string]int64
	// walkAt is the size of above that calls for the next walk: it
	// doubles while a gap keeps the walk from folding them, so a group
	// stuck behind an unhandled event walks the store rarely, not per
	// event.
	walkAt int
}

// compactAt is how many handled positions above the watermark a group
// keeps before its consumer walks the store to fold them into it; maxAbove
// bounds them when the walk cannot (an event before them is never
// handled: dead-lettered, or its partition halted): then they are dropped,
// and a wait past that event runs into its bound, as it would anyway.
const (
	compactAt = 4096
	maxAbove  = 1 << 20
	// walkBatch is how many events one store read of the walk takes.
	walkBatch = 512
	// firstBackPage is how many events the first read of a backward
	// search for a key's last event takes (lastOfKey): the usual one finds
	// it first.
	firstBackPage = 16
	// firstRemotePoll and remotePoll pace a wait's re-checks when other
	// host instances may be handling its events (they do not wake it):
	// the first after 5 ms, each next twice as late, then every 50 ms.
	// Another host's projection usually lands within a few milliseconds;
	// a fixed 50 ms poll made that the median read-your-writes latency of
	// a read on another host than its projection's (make load, 3 hosts:
	// 53 ms).
	firstRemotePoll = 5 * time.Millisecond
	remotePoll      = 50 * time.Millisecond
	// heardPoll is the safety net's poll of a keyed wait whose unit's
	// commits all wake it while this process hears the others' commits:
	// a unit this process runs (its own marks; if it was lost meanwhile,
	// its new owner's commits are heard), or another process's unit when
	// every advance is announced as its key's (HearsEveryAdvance: no
	// priority lanes). The poll, which reads the unit's position, then
	// only covers an announcement that came and was forgotten (maxKeyed)
	// before the wait began; a loss of hearing wakes the waits at once
	// (Hearing). At remotePoll, every wait that a stall of a few tens of
	// milliseconds held past 50 ms read its row at once, and those reads
	// queued for the database pool with the commands' own loads (make
	// load, 1 host: the half-load tail's bursts).
	heardPoll = 250 * time.Millisecond
	// maxKeyed bounds the keys whose keyed progress a group keeps per
	// category; past it they are forgotten (a keyed check then starts at
	// the watermark again).
	maxKeyed = 1 << 16
)

func newMarks() *marks {
	return &marks{groups: map[string]map[string]*handled{}, changed: make(chan struct{})}
}

func (p *marks) stateLocked(group, category string) *handled {
	g := p.groups[group]
	if g == nil {
		g = map[string]*handled{}
		p.groups[group] = g
	}
	h := g[category]
	if h == nil {
		h = &handled{above: map[int64]struct{}{}, walkAt: compactAt}
		g[category] = h
	}
	return h
}

// mark records that group handled the event at global position gp of
// category, and reports whether the group holds enough positions above its
// watermark to be worth a walk.
func (p *marks) mark(group, category string, gp int64, key string) (compact bool) {
	if gp <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	if gp > h.upTo {
		h.above[gp] = struct{}{}
	}
	if key != "" {
		h.inOrderTo(key, gp)
	}
	p.wakeLocked()
	return len(h.above) >= h.walkAt
}

// inOrderTo raises key's in-order mark to gp (forgetting every key's
// first when maxKeyed are kept), and reports whether it moved.
func (h *handled) inOrderTo(key string, gp int64) bool {
	if h.inOrder == nil || len(h.inOrder) >= maxKeyed {
		h.inOrder = map[string]int64{}
	}
	if gp <= h.inOrder[key] {
		return false
	}
	h.inOrder[key] = gp
	return true
}

// wakeLocked wakes every wait on the marks (wait).
func (p *marks) wakeLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// handledInOrderTo records that every event of key at or below gp is
// handled (inOrder), and wakes the waits, as a keyed mark does, without
// marking gp itself above the watermark.
func (p *marks) handledInOrderTo(group, category, key string, gp int64) {
	if gp <= 0 || key == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stateLocked(group, category).inOrderTo(key, gp) {
		p.wakeLocked()
	}
}

// wake wakes every wait on the marks, as a mark does.
func (p *marks) wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wakeLocked()
}

// wait returns a channel closed at the next mark.
func (p *marks) wait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

func (p *marks) watermark(group, category string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(group, category).upTo
}

func (p *marks) has(group, category string, gp int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	_, ok := h.above[gp]
	return ok || gp <= h.upTo
}

// keyedAt is the position up to which a keyed check found every event of
// key handled (0: none known).
func (p *marks) keyedAt(group, category, key string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(group, category).keyed[key]
}

// handledInOrder is the last event of key that this process handled in
// key order (0: none known): every event of the key at or below it is
// handled.
func (p *marks) handledInOrder(group, category, key string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(group, category).inOrder[key]
}

// keyedTo records that a keyed check found every event of key up to n
// handled.
func (p *marks) keyedTo(group, category, key string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	if h.keyed == nil || len(h.keyed) >= maxKeyed {
		h.keyed = map[string]int64{}
	}
	if n > h.keyed[key] {
		h.keyed[key] = n
	}
}

// advance raises the watermark to w (never lowers it) and forgets the
// positions it covers; past maxAbove it drops the rest (see maxAbove).
func (p *marks) advance(group, category string, w int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	if w > h.upTo {
		h.upTo = w
		for gp := range h.above {
			if gp <= w {
				delete(h.above, gp)
			}
		}
	}
	if len(h.above) >= maxAbove {
		h.above = map[int64]struct{}{}
	}
	h.walkAt = max(compactAt, 2*len(h.above))
}
