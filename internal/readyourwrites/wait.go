package readyourwrites

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/proteanhq/protean-host/eventstore"
)

// Events is what the walk reads of the event store (eventstore.Store has
// it).
type Events interface {
	ReadCategory(ctx context.Context, category string, from int64, n int) ([]eventstore.Event, error)
}

// Options configure a Waiter.
type Options struct {
	Events Events
	// KeyOf is the partition key an event's payload holds in field, if it
	// holds one: a keyed wait tells its key's events by it.
	KeyOf func(data json.RawMessage, field string) (string, bool)
	// After is what a wait that polls its sources sleeps on (nil:
	// time.After).
	After  func(time.Duration) <-chan time.Time
	Logger *slog.Logger
}

// Waiter keeps what this process's consumers have handled and waits on it
// and on the sources (see the package doc).
type Waiter struct {
	opts    Options
	marks   *marks
	recent  recent
	hearing atomic.Bool // Hearing
	// everyAdvance: HearsEveryAdvance.
	everyAdvance atomic.Bool
}

// New returns a Waiter.
func New(opts Options) *Waiter {
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Waiter{opts: opts, marks: newMarks()}
}

// Target is one category a wait covers, and the source that delivers it
// to the group (nil: none that knows of other processes).
type Target struct {
	Route
	Source Source
}

// Mark records that r.Group handled the event at global position gp of
// r.Category in this process, and reports whether enough marks have
// gathered above the group's watermark to fold them into it (Fold). key
// is the event's partition key when its deliverer applies each key's
// events in order, every one before the next (a partition unit, an
// event-store subscription), else "": a keyed wait for the key up to a
// position at or below gp is then done without a read.
func (w *Waiter) Mark(r Route, gp int64, key string) (fold bool) {
	return w.marks.mark(r.Group, r.Category, gp, key)
}

// HandledElsewhere records that r.Group handled, in another process,
// every event of key in r.Category at or below gp: the key's unit there
// committed them, in key order (a committed advance another host announced,
// position.Advances). A keyed wait for the key up to gp is then done without
// a read, and a keyed wait stopped at such an event wakes; unkeyed waits
// and the watermark take no notice (the events below gp are not marked one
// by one).
func (w *Waiter) HandledElsewhere(r Route, gp int64, key string) {
	w.marks.handledInOrderTo(r.Group, r.Category, key, gp)
}

// Hearing says whether HandledElsewhere is told of other processes'
// commits as they happen. While it is, a keyed wait on a unit another
// process runs sleeps until such a commit wakes it, reading the unit's
// position at the safety net's poll only, not at the quick remote polls
// (5, 10, 20, 40 ms) that would find each commit without it.
//
// A change wakes every wait, so that one that relied on hearing and lost
// it checks again at once, at the pace of a wait that does not hear.
func (w *Waiter) Hearing(on bool) {
	if w.hearing.Swap(on) != on {
		w.marks.wake()
	}
}

// HearsEveryAdvance says that, while hearing, every commit of a key's
// unit is told as the key's (HandledElsewhere): no event travels a
// priority lane, whose unit's advances are not. A keyed wait on another
// process's unit then polls at the slow safety pace (250 ms) too, as one
// on this process's unit does; otherwise at 50 ms, for the lane events.
// Off by default.
func (w *Waiter) HearsEveryAdvance(on bool) { w.everyAdvance.Store(on) }

// Appended records events this process has just committed to the store
// (a command's): a keyed wait for the key of one of them, at that event's
// own position (the reader's own write), then finds the key's last event
// without a read. The Waiter keeps the last recentSlots of them.
func (w *Waiter) Appended(events []eventstore.Event) { w.recent.add(events) }

// Fold walks the store up to gp (the mark that called for it) to fold
// r.Group's marks in r.Category into its watermark. local, if set, is asked about the events the walk finds
// unmarked: pass a source that reads nothing (the broker groups'); a
// remote source's reads are kept for waits.
func (w *Waiter) Fold(ctx context.Context, r Route, gp int64, local Source) {
	if _, err := w.caughtUp(ctx, Target{Route: r, Source: local}, gp, &pass{}); err != nil {
		w.opts.Logger.Warn("read-your-writes: walking the store failed", "group", r.Group, "category", r.Category, "error", err)
	}
	w.marks.advance(r.Group, r.Category, 0) // applies maxAbove
}

// pass is one check of a wait: what it asked its sources, and where it
// stopped.
type pass struct {
	projection string
	position   int64
	checks     map[Source]Check
	// field and key, when field is set, narrow the wait to the events
	// whose field holds key (a read of one document of a projector that
	// declares documents_by_key): the others are not waited for.
	field, key string
	// stuck is the event the check stopped at (not handled here nor, by
	// its source, elsewhere), in stuckCategory: until it is marked handled
	// here, or the remote poll is due, a check again would stop at it too.
	stuck         int64
	stuckCategory string
	// lastOfKey holds, per category, the position of the key's last event
	// at or below position (0: it has none there), once a search found
	// it; it lives as long as the wait, across its checks (keyCaughtUp).
	lastOfKey map[string]int64
	// local is set when this process runs the key's unit of the target
	// checked last (LocalCheck), whose answer needs no read; polled when
	// this check runs because a poll was due, not on a mark: a poll reads
	// the source, as a local answer may lag a unit lost meanwhile.
	local, polled bool
	// heard is whether this process heard the others' commits when the
	// check began (Hearing): the check and its pace read it once.
	heard bool
}

// check is the pass's check of src, begun at its first question.
func (p *pass) check(src Source) Check {
	c, ok := p.checks[src]
	if !ok {
		if p.checks == nil {
			p.checks = map[Source]Check{}
		}
		c = src.Check(p.projection, p.position)
		p.checks[src] = c
	}
	return c
}

// elsewhere asks t's source whether ev is handled (false without one).
func (p *pass) elsewhere(ctx context.Context, t Target, ev eventstore.Event) (bool, error) {
	if t.Source == nil {
		return false, nil
	}
	return p.check(t.Source).Handled(ctx, t.Route, ev)
}

// ofKey reports whether ev is an event of the keyed pass's key.
func (w *Waiter) ofKey(p *pass, ev eventstore.Event) bool {
	k, ok := w.opts.KeyOf(ev.Data, p.field)
	return ok && k == p.key
}

// caughtUp reports whether t.Group has handled every event of t.Category
// at or below n, advancing its watermark over what it finds handled.
//
// A keyed pass (p.field set) waits only for the events of its key: it asks
// the source for the key's unit when it can (keyCaughtUp); otherwise it
// starts past the watermark and past what an earlier keyed check found
// handled for the key, moves the watermark only over a prefix of handled
// events (checking other keys' events as an unkeyed check does while it
// can), and past the first other key's event that is not handled skips
// the other keys' events unread.
func (w *Waiter) caughtUp(ctx context.Context, t Target, n int64, p *pass) (done bool, _ error) {
	group, category := t.Group, t.Category
	wm := w.marks.watermark(group, category)
	keyed := p.field != ""
	defer func() {
		w.marks.advance(group, category, wm)
		if done && keyed {
			w.marks.keyedTo(group, category, p.key, n)
		}
	}()
	if keyed && t.Field == p.field && t.Source != nil {
		keyedAt := w.marks.keyedAt(group, category, p.key)
		if keyedAt >= n || w.marks.handledInOrder(group, category, p.key) >= n {
			// This process handled the key's events up to n or past it,
			// in order: the usual read of one's own write, once its
			// projection has run here, reads nothing.
			return true, nil
		}
		c := p.check(t.Source)
		if lc, ok := c.(LocalCheck); ok {
			at, owned := lc.LocalKeyPosition(t.Route, p.key)
			p.local = owned // a poll reads the source below, and still paces as local
			if owned && !p.polled {
				return w.keyCaughtUp(ctx, t, n, p, at, keyedAt)
			}
			if !owned && !p.polled && p.heard && !t.Correlated {
				// Another process runs the key's unit, and its commits
				// are announced (HandledElsewhere): the wait sleeps until
				// one covers it, and reads the unit's position at the
				// safety net's poll only. 0 is what is known of it. (A
				// process manager's unit is its correlation value's, not
				// the key its streams are announced by: it is read.)
				return w.keyCaughtUp(ctx, t, n, p, 0, keyedAt)
			}
		}
		at, byUnit, err := c.KeyPosition(ctx, t.Route, p.key)
		if err != nil {
			return false, err
		}
		if byUnit {
			return w.keyCaughtUp(ctx, t, n, p, at, keyedAt)
		}
	}
	from, prefix := wm, true
	if keyed {
		from = max(wm, w.marks.keyedAt(group, category, p.key))
		prefix = from == wm
	}
	for from < n {
		evs, err := w.opts.Events.ReadCategory(ctx, category, from+1, walkBatch)
		if err != nil {
			return false, err
		}
		for _, ev := range evs {
			if ev.GlobalPosition > n {
				return true, nil
			}
			switch {
			case w.marks.has(group, category, ev.GlobalPosition):
			case keyed && !w.ofKey(p, ev):
				// Another key's: not waited for. While the watermark can
				// still move, see whether another host handled it, as an
				// unkeyed check would; past the first that is not, skip
				// the other keys' events unread.
				if prefix {
					ok, err := p.elsewhere(ctx, t, ev)
					if err != nil && !errors.Is(err, ErrFailed) {
						return false, err
					}
					prefix = ok && err == nil // another key's failure is not this read's
				}
			default:
				ok, err := p.elsewhere(ctx, t, ev)
				if err != nil || !ok {
					p.stuck, p.stuckCategory = ev.GlobalPosition, category
					return false, err
				}
			}
			from = ev.GlobalPosition
			if prefix {
				wm = from
			}
		}
		if len(evs) < walkBatch {
			return true, nil // nothing of the category is left at or below n
		}
	}
	return true, nil
}

// keyCaughtUp is a keyed check by the key's unit, which has committed up
// to at: the key's events at or below n are handled once at has reached
// the last of them. The first check of a wait whose unit is short of n
// finds that last event once, searching back from n (lastOfKey; other
// keys' events are read, not looked up); the wait's later checks are one
// read of the unit's position each. Before, each check walked from the
// watermark and read the positions row of every other key it passed,
// about a third of a loaded host's CPU with 3 hosts.
func (w *Waiter) keyCaughtUp(ctx context.Context, t Target, n int64, p *pass, at, keyedAt int64) (bool, error) {
	if at >= n {
		return true, nil
	}
	last, known := p.lastOfKey[t.Category]
	if !known {
		// Every event at or below the watermark is handled: only the
		// key's events above it and the unit's position matter.
		floor := max(at, keyedAt, w.marks.watermark(t.Group, t.Category))
		var err error
		last, err = w.lastOfKey(ctx, t.Category, floor, n, p)
		if err != nil {
			return false, err
		}
		p.lastOfKey[t.Category] = last
	}
	if at >= last || w.marks.has(t.Group, t.Category, last) || w.marks.handledInOrder(t.Group, t.Category, p.key) >= last {
		return true, nil
	}
	p.stuck, p.stuckCategory = last, t.Category
	return false, nil
}

// lastOfKey is the position of the last event of p's key in category
// after floor and at or below n, 0 if there is none. A store that reads a
// category backward (eventstore.BackwardReader: Memory and Postgres)
// is read from n down in pages of firstBackPage events, each next one 4
// times larger up to walkBatch, and the search stops at the first event
// of the key: the usual case, the reader's own command's event at n,
// costs one read of a few events and one key decoded, however far back
// the key's unit (a new key's: nowhere) or the watermark is. Another
// store is searched forward in windows (lastOfKeyForward), with the same
// answer.
func (w *Waiter) lastOfKey(ctx context.Context, category string, floor, n int64, p *pass) (int64, error) {
	if data, ok := w.recent.at(category, n); ok && n > floor {
		if k, ok := w.opts.KeyOf(data, p.field); ok && k == p.key {
			return n, nil // the key's own event is at n: none can be later
		}
	}
	br, ok := w.opts.Events.(eventstore.BackwardReader)
	if !ok {
		return w.lastOfKeyForward(ctx, category, floor, n, p)
	}
	for hi, page := n, int64(firstBackPage); hi > floor; page = min(4*page, walkBatch) {
		// The category has at most hi-floor events in (floor, hi].
		limit := int(min(page, hi-floor))
		evs, err := br.ReadCategoryBackward(ctx, category, floor, hi, limit)
		if err != nil {
			return 0, err
		}
		for _, ev := range evs {
			if ev.GlobalPosition <= floor {
				return 0, nil
			}
			if w.ofKey(p, ev) {
				return ev.GlobalPosition, nil
			}
		}
		if len(evs) < limit {
			return 0, nil // the category has no more at or below hi
		}
		hi = evs[len(evs)-1].GlobalPosition - 1
	}
	return 0, nil
}

// lastOfKeyForward is lastOfKey on a store that reads forward only: it
// reads windows of walkBatch positions backwards from n (each one
// category read, which a window cannot overflow), each window's events
// whole and forward, and decodes the key of every event of the window.
func (w *Waiter) lastOfKeyForward(ctx context.Context, category string, floor, n int64, p *pass) (int64, error) {
	for hi := n; hi > floor; {
		lo := max(floor+1, hi-walkBatch+1)
		evs, err := w.opts.Events.ReadCategory(ctx, category, lo, walkBatch)
		if err != nil {
			return 0, err
		}
		var last int64
		for _, ev := range evs {
			if ev.GlobalPosition > hi {
				break
			}
			if w.ofKey(p, ev) {
				last = ev.GlobalPosition
			}
		}
		if last > 0 {
			return last, nil
		}
		hi = lo - 1
	}
	return 0, nil
}

// Wait waits until, for every target, its group has handled every event
// of its category at or below global position n, or ctx ends: then it
// returns a *CaughtUpError (errors.Is ErrNotCaughtUp and ctx's error).
// targets is called at each check, as a reload may change them; its error
// ends the wait. With field set, a target whose partition field is field
// waits for the events whose field holds key alone. An event a source
// recorded as failed ends the wait with the source's error (ErrFailed).
func (w *Waiter) Wait(ctx context.Context, projection string, n int64, field, key string, targets func() ([]Target, error)) error {
	lastOfKey := map[string]int64{} // what keyed checks found, for the whole wait
	pollEvery := firstRemotePoll
	polled := false
	for {
		ts, err := targets()
		if err != nil {
			return err
		}
		changed := w.marks.wait()
		heard := w.hearing.Load() // before the checks: a change after it wakes the wait
		// quick: a remote target that no commit of another process wakes
		// (not keyed by this wait's key, or HandledElsewhere not told).
		done, remote, local, quick := true, false, false, false
		p := &pass{projection: projection, position: n, field: field, key: key, lastOfKey: lastOfKey, polled: polled, heard: heard}
		for _, t := range ts {
			p.local = false
			ok, err := w.caughtUp(ctx, t, n, p)
			// A unit of this process's marks what it handles, which wakes
			// the wait: its target is polled only as a safety net.
			local = local || p.local
			if t.Source != nil && t.Source.Remote() && !p.local {
				remote = true
				quick = quick || field == "" || t.Field != field || t.Correlated || !heard
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
			if !ok || err != nil {
				done = false
				break
			}
		}
		if done {
			return nil
		}
		var poll <-chan time.Time
		switch {
		case quick:
			poll = w.opts.After(pollEvery)
			pollEvery = min(2*pollEvery, remotePoll)
		case remote && !w.everyAdvance.Load(), local && !heard:
			// Its units' commits wake it (Mark, HandledElsewhere), except
			// a lane's, or a lost unit's new owner's: the poll is a
			// safety net for those.
			poll = w.opts.After(remotePoll)
		case remote, local:
			// Every commit of its units wakes it: the poll only covers
			// an announcement forgotten before the wait began.
			poll = w.opts.After(heardPoll)
		}
		polled = false
	sleep:
		for {
			select {
			case <-ctx.Done():
				return &CaughtUpError{Projection: projection, Position: n, Err: ctx.Err()}
			case <-poll:
				polled = true
				break sleep
			case <-changed:
				if w.hearing.Load() != heard {
					break sleep // paced for hearing that changed
				}
				// Every mark wakes every waiter: check again only once
				// the event this check stopped at is marked (another
				// host's handling shows at the poll), not on every
				// other event's mark.
				if p.stuck == 0 {
					break sleep
				}
				changed = w.marks.wait() // before the look, so no mark is missed
				if w.marks.has(projection, p.stuckCategory, p.stuck) ||
					key != "" && w.marks.handledInOrder(projection, p.stuckCategory, key) >= p.stuck {
					break sleep
				}
			}
		}
	}
}
