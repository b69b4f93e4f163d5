package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
	esub "github.com/proteanhq/protean-host/subscription"
)

// Read-your-writes. A client that got global position N from a command's
// answer may ask for a projection "as of N": WaitHandled blocks until the
// projection's handler (its consumer group) has handled every event of its
// categories at or below N. Events of other categories do not concern it.
//
// What "handled" means is decided against the event store, not against a
// delivery order: the group's consumers report each event whose effects
// committed (mark), and a check walks the category's events above the
// group's watermark in the store, advancing the watermark across handled
// ones and stopping at the first that is not. So it holds whatever order
// the relay and the broker deliver in, and an event that is dead-lettered
// or held by a halted partition is never counted as handled (the wait runs
// into its bound). Within one category the store's commits follow global
// position order (MessageDB's advisory lock; the memory store appends
// under one lock), so an event cannot appear below the watermark after the
// walk has passed it.
//
// Broker consumer groups (the inline broker, a Redis stream's groups for
// an unpartitioned category) record nothing durable: an event appended
// before this engine started its consumers counts as handled (it was
// delivered by an earlier process, or, on the inline broker, never will
// be), so a restarted host does not wait on the past for ever.
//
// Events of a partitioned category that another host instance handled are
// not marked here: for them the check reads the consumer-positions row of
// the event's unit (Options.Positions), whose position for the event's
// partition stream has reached the event once its effects committed. The
// engine gives every event one priority, so a partition's events all
// travel one lane; the check takes the highest position recorded for the
// partition stream or its lane. A read of one document of a projector
// partitioned by the document's key (documents_by_key) asks that key's
// unit alone (keyCaughtUp): once per wait a search back from N finds the
// key's last event at or below N, then each check is one read of the
// unit's row.
//
// With event-store subscriptions the unit is the category, and its
// position also passes an event the subscription recorded as failed (or
// held behind a failure of its key) and went on from: the check reads the
// group's open failure records (Options.Failures) too. Such an event is
// not handled, and nothing will handle it until an operator acts, so a
// wait that reaches it ends at once with a *FailedError naming it (the API
// answers 500) rather than answer a document without the event's effects,
// or wait into the bound as if the projector were only slow. An event an
// operator set to retry is waited for (its rerun is on its way); one
// skipped counts as handled (the operator gave it up: the projection is
// final without it, and later reads must not fail on it for ever).

// progress is what this process's consumers have handled, per consumer
// group and category.
type progress struct {
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
	// remotePoll is how often a wait re-checks when other host instances
	// may be handling its events (they do not wake it).
	remotePoll = 50 * time.Millisecond
)

func newProgress() *progress {
	return &progress{groups: map[string]map[string]*handled{}, changed: make(chan struct{})}
}

func (p *progress) stateLocked(group, category string) *handled {
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
func (p *progress) mark(group, category string, gp int64) (compact bool) {
	if gp <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	if gp > h.upTo {
		h.above[gp] = struct{}{}
	}
	close(p.changed)
	p.changed = make(chan struct{})
	return len(h.above) >= h.walkAt
}

// wait returns a channel closed at the next mark.
func (p *progress) wait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

func (p *progress) watermark(group, category string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(group, category).upTo
}

func (p *progress) has(group, category string, gp int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	_, ok := h.above[gp]
	return ok || gp <= h.upTo
}

// maxKeyed bounds the keys whose keyed progress a group keeps per
// category; past it they are forgotten (a keyed check then starts at the
// watermark again).
const maxKeyed = 1 << 16

// keyedAt is the position up to which a keyed check found every event of
// key handled (0: none known).
func (p *progress) keyedAt(group, category, key string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateLocked(group, category).keyed[key]
}

// keyedTo records that a keyed check c found every event of its key up
// to n handled; an unkeyed check records nothing.
func (p *progress) keyedTo(group, category string, c *check, n int64) {
	if c == nil || c.field == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.stateLocked(group, category)
	if h.keyed == nil || len(h.keyed) >= maxKeyed {
		h.keyed = map[string]int64{}
	}
	if n > h.keyed[c.key] {
		h.keyed[c.key] = n
	}
}

// advance raises the watermark to w (never lowers it) and forgets the
// positions it covers; past maxAbove it drops the rest (see maxAbove).
func (p *progress) advance(group, category string, w int64) {
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

// Failures lists a consumer group's failure records in a unit
// (subscription.Failures has it).
type Failures interface {
	List(ctx context.Context, group, unit string, open bool) ([]esub.Failure, error)
}

// ErrFailed: an event at or below the position waited for failed in the
// projection's handler and is recorded for an operator.
var ErrFailed = errors.New("projection's handler failed an event")

// FailedError is ErrFailed with the wait and the failure record.
type FailedError struct {
	Projection string
	Position   int64
	Failure    esub.Failure
}

func (e *FailedError) Error() string {
	f := e.Failure
	what := "failed"
	if f.Status == esub.StatusHeld {
		what = "holds, behind an earlier failure of its key,"
	}
	return fmt.Sprintf("projection %s cannot reach global position %d: its handler %s the %s event at global position %d (stream %s): an operator must retry or skip it (protean-host subscriptions failed)",
		e.Projection, e.Position, what, f.Type, f.GlobalPosition, f.Stream)
}

// Unwrap returns ErrFailed.
func (e *FailedError) Unwrap() error { return ErrFailed }

// check caches what one WaitHandled check reads of other sources than
// this process: the positions rows and the open failure records, per
// unit. A nil *check consults neither.
type check struct {
	projection string
	position   int64
	rows       map[string]position.Row
	open       map[string]map[int64]esub.Failure
	// field and key, when field is set, narrow the wait to the events
	// whose field holds key (a read of one document of a projector that
	// declares documents_by_key): the others are not waited for.
	field, key string
	// stuck is the event the check stopped at (not handled here nor, by
	// the positions table, elsewhere), in stuckCategory: until it is
	// marked handled here, or the remote poll is due, a check again would
	// stop at it too.
	stuck         int64
	stuckCategory string
	// lastOfKey holds, per category, the position of the key's last event
	// at or below position (0: it has none there), once a search found
	// it; it lives as long as the wait, across its checks (keyCaughtUp).
	lastOfKey map[string]int64
}

func newCheck(projection string, n int64) *check {
	return &check{projection: projection, position: n, rows: map[string]position.Row{}, open: map[string]map[int64]esub.Failure{}}
}

// handledEvent records that group handled the event at gp of category,
// and walks the store when enough have gathered above the watermark.
func (e *Engine) handledEvent(ctx context.Context, group, category string, gp int64) {
	if !e.progress.mark(group, category, gp) {
		return
	}
	if _, err := e.caughtUp(ctx, group, category, gp, nil); err != nil {
		e.log.Warn("read-your-writes: walking the store failed", "group", group, "category", category, "error", err)
	}
	e.progress.advance(group, category, 0) // applies maxAbove
}

// caughtUp reports whether group has handled every event of category at or
// below n, advancing its watermark over what it finds handled. rows caches
// the positions rows a check has read (nil: do not consult them).
//
// A keyed check (c.field set) waits only for the events of its key: it
// starts past the watermark and past what an earlier keyed check found
// handled for the key, moves the watermark only over a prefix of handled
// events (checking other keys' events as an unkeyed check does while it
// can), and past the first other key's event that is not handled skips
// the other keys' events unread.
func (e *Engine) caughtUp(ctx context.Context, group, category string, n int64, c *check) (done bool, _ error) {
	w := e.progress.watermark(group, category)
	defer func() {
		e.progress.advance(group, category, w)
		if done {
			e.progress.keyedTo(group, category, c, n)
		}
	}()
	keyed := c != nil && c.field != ""
	if keyed && e.keyedByUnit(category, c) {
		return e.keyCaughtUp(ctx, group, category, n, c)
	}
	from, prefix := w, true
	if keyed {
		from = max(w, e.progress.keyedAt(group, category, c.key))
		prefix = from == w
	}
	for from < n {
		evs, err := e.opts.Events.ReadCategory(ctx, category, from+1, walkBatch)
		if err != nil {
			return false, err
		}
		for _, ev := range evs {
			if ev.GlobalPosition > n {
				return true, nil
			}
			switch {
			case e.progress.has(group, category, ev.GlobalPosition):
			case keyed && !c.ofKey(ev):
				// Another key's: not waited for. While the watermark can
				// still move, see whether another host handled it, as an
				// unkeyed check would; past the first that is not, skip
				// the other keys' events unread.
				if prefix {
					ok, err := e.handledElsewhere(ctx, group, category, ev, c)
					var failed *FailedError
					if err != nil && !errors.As(err, &failed) {
						return false, err
					}
					prefix = ok && err == nil // another key's failure is not this read's
				}
			default:
				ok, err := e.handledElsewhere(ctx, group, category, ev, c)
				if err != nil || !ok {
					if c != nil {
						c.stuck, c.stuckCategory = ev.GlobalPosition, category
					}
					return false, err
				}
			}
			from = ev.GlobalPosition
			if prefix {
				w = from
			}
		}
		if len(evs) < walkBatch {
			return true, nil // nothing of the category is left at or below n
		}
	}
	return true, nil
}

// keyedByUnit reports whether a keyed check of category can ask the
// positions table for its key's unit alone: the category's partition key
// is the check's field, so every event of the key is one unit's, applied
// in publish order on one lane (the engine gives a partition's events one
// priority), and that unit's position says which of them are handled.
func (e *Engine) keyedByUnit(category string, c *check) bool {
	if e.opts.EventStore || !e.opts.Partitioned || e.opts.Positions == nil {
		return false
	}
	field, ok := e.Set().PartitionField(category)
	return ok && field == c.field
}

// keyCaughtUp is a keyed check by the key's unit: the key's events at or
// below n are handled once the unit's position (its stream's or lane's,
// committed with each run's effects, whichever host ran it) has reached
// the last of them. The first check of a wait whose position is short of
// n finds that last event once, searching back from n (lastOfKey; other
// keys' events are read, not looked up); the wait's later checks are one
// positions read each. Before, each check walked from the
// watermark and read the positions row of every other key it passed,
// about a third of a loaded host's CPU with 3 hosts.
//
// caughtUp, its only caller, records what a done check found (keyedTo).
func (e *Engine) keyCaughtUp(ctx context.Context, group, category string, n int64, c *check) (bool, error) {
	keyedAt := e.progress.keyedAt(group, category, c.key)
	if keyedAt >= n {
		return true, nil
	}
	unit, stream := keyUnit(e.Set(), group, category, c.key)
	row, _, err := e.opts.Positions.Get(ctx, group, unit)
	if err != nil {
		return false, err
	}
	at := sourcePosition(row, stream, true)
	if at >= n {
		return true, nil
	}
	last, known := c.lastOfKey[category]
	if !known {
		// Every event at or below the watermark is handled: only the
		// key's events above it and the unit's position matter.
		floor := max(at, keyedAt, e.progress.watermark(group, category))
		last, err = e.lastOfKey(ctx, category, floor, n, c)
		if err != nil {
			return false, err
		}
		c.lastOfKey[category] = last
	}
	if at >= last || e.progress.has(group, category, last) {
		return true, nil
	}
	c.stuck, c.stuckCategory = last, category
	return false, nil
}

// lastOfKey is the position of the last event of c's key in category
// after floor and at or below n, 0 if there is none. It reads windows of
// walkBatch positions backwards from n (each one category read, which a
// window cannot overflow), so a key whose last event is the reader's own
// command's, the usual case, costs one read however far back the key's
// unit (a new key's: nowhere) or the watermark is.
func (e *Engine) lastOfKey(ctx context.Context, category string, floor, n int64, c *check) (int64, error) {
	for hi := n; hi > floor; {
		lo := max(floor+1, hi-walkBatch+1)
		evs, err := e.opts.Events.ReadCategory(ctx, category, lo, walkBatch)
		if err != nil {
			return 0, err
		}
		var last int64
		for _, ev := range evs {
			if ev.GlobalPosition > hi {
				break
			}
			if c.ofKey(ev) {
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

// keyUnit is the unit that handles key's events of category for group,
// and the stream those events travel: the partition, or a correlated
// process manager's value.
func keyUnit(set *host.Set, group, category, key string) (unit, stream string) {
	unit, stream = partition.PartitionUnit(category, key), partition.StreamName(category, key)
	if correlated(set, group) {
		unit = partition.CorrelationUnit(group, key)
	}
	return unit, stream
}

// sourcePosition is the highest position row records for stream, or with
// lanes also for one of its lanes ({stream}:{suffix}).
func sourcePosition(row position.Row, stream string, lanes bool) int64 {
	var at int64
	for src, pos := range row.Positions {
		if (src == stream || lanes && strings.HasPrefix(src, stream+":")) && pos > at {
			at = pos
		}
	}
	return at
}

// ofKey reports whether ev is an event of the keyed check's key.
func (c *check) ofKey(ev eventstore.Event) bool {
	k, ok := fieldKey(ev.Data, c.field)
	return ok && k == c.key
}

// handledElsewhere reports whether another host instance has committed
// the effects of ev for group, by the positions row of ev's unit: with
// event-store subscriptions the unit and source are the category; with
// partition workers the unit is ev's partition (or a correlated process
// manager's value) and the source its partition stream or lane. It is
// false where no such row can exist (no positions store, or a category
// the broker's consumer groups deliver). With event-store subscriptions,
// an event the position passed but that has an open failure record is not
// handled: a *FailedError (failed, held), or false (set to retry).
func (e *Engine) handledElsewhere(ctx context.Context, group, category string, ev eventstore.Event, c *check) (bool, error) {
	set := e.Set()
	_, keyed := set.PartitionField(category)
	if !e.opts.EventStore && (!e.opts.Partitioned || !keyed) {
		// A broker consumer group (inline, or a stream's): there is no
		// positions row. An event appended before this engine started
		// its consumers was delivered by an earlier process, or never
		// will be (the inline broker keeps nothing across a restart):
		// count it handled, or a restarted host would wait on it for
		// ever.
		since := e.startedAt.Load()
		return since != 0 && ev.Time.UnixNano() < since, nil
	}
	if c == nil || e.opts.Positions == nil {
		return false, nil
	}
	unit, stream, lanes := category, category, false
	if !e.opts.EventStore {
		key, ok := partitionKey(set, category, ev.Data)
		if !ok {
			return false, nil
		}
		unit, stream = keyUnit(set, group, category, key)
		lanes = true
	}
	row, seen := c.rows[unit]
	if !seen {
		var err error
		row, _, err = e.opts.Positions.Get(ctx, group, unit)
		if err != nil {
			return false, err
		}
		c.rows[unit] = row
	}
	if sourcePosition(row, stream, lanes) < ev.GlobalPosition {
		return false, nil
	}
	if e.opts.EventStore {
		return e.notFailed(ctx, group, unit, ev.GlobalPosition, c)
	}
	return true, nil
}

// notFailed reports whether the event at gp, which group's subscription
// of unit has passed, was handled rather than recorded as failed (see the
// overview above).
func (e *Engine) notFailed(ctx context.Context, group, unit string, gp int64, c *check) (bool, error) {
	if e.opts.Failures == nil {
		return true, nil
	}
	open, seen := c.open[unit]
	if !seen {
		fs, err := e.opts.Failures.List(ctx, group, unit, true)
		if err != nil {
			return false, err
		}
		open = make(map[int64]esub.Failure, len(fs))
		for _, f := range fs {
			open[f.GlobalPosition] = f
		}
		c.open[unit] = open
	}
	f, failed := open[gp]
	switch {
	case !failed:
		return true, nil
	case f.Status == esub.StatusRetry:
		return false, nil
	}
	return false, &FailedError{Projection: c.projection, Position: c.position, Failure: f}
}

// partitionKey is the partition key of an event of category, if the
// category is partitioned.
func partitionKey(set *host.Set, category string, data json.RawMessage) (string, bool) {
	field, ok := set.PartitionField(category)
	if !ok {
		return "", false
	}
	return fieldKey(data, field)
}

// fieldKey is the partition key a payload's field holds, if it holds one.
func fieldKey(data json.RawMessage, field string) (string, bool) {
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return "", false
	}
	return partition.KeyString(fields[field])
}

// correlated reports whether group is a process manager that owns its
// correlation values across categories (one unit per value).
func correlated(set *host.Set, group string) bool {
	r, ok := set.ProjectionRoute(group)
	return ok && r.Handler.Kind == abi.KindProcessManager && r.Handler.SequentialBy.Correlation
}

// ErrNotCaughtUp: a wait for a projection to reach a position ended first.
var ErrNotCaughtUp = errors.New("projection has not caught up")

// CaughtUpError is ErrNotCaughtUp with what was waited for.
type CaughtUpError struct {
	Projection string
	Position   int64
	Err        error // the context's error that ended the wait
}

func (e *CaughtUpError) Error() string {
	return fmt.Sprintf("projection %s has not handled global position %d yet: %v", e.Projection, e.Position, e.Err)
}

// Unwrap returns ErrNotCaughtUp and the context's error.
func (e *CaughtUpError) Unwrap() []error { return []error{ErrNotCaughtUp, e.Err} }

// WaitHandled waits until the projector or process manager named name has
// handled every event of its categories at or below global position n
// (see the overview above), or ctx ends: then it returns a *CaughtUpError
// (errors.Is ErrNotCaughtUp and ctx's error). An unknown name is
// ErrUnknownProjection; an event at or below n that its event-store
// subscription recorded as failed or held is a *FailedError (ErrFailed).
func (e *Engine) WaitHandled(ctx context.Context, name string, n int64) error {
	return e.waitHandled(ctx, name, n, "", "")
}

// WaitDocument is WaitHandled for a read of document id of the projector
// name. When the projector declares documents_by_key (abi.Handler), the
// document is written only by the events whose partition field holds id,
// so it waits for those events alone: other keys' events, slow or held
// by a halted partition, do not hold the read back. Otherwise it waits as
// WaitHandled does.
func (e *Engine) WaitDocument(ctx context.Context, name, id string, n int64) error {
	if r, ok := e.Set().ProjectionRoute(name); ok && r.Handler.DocumentsByKey {
		return e.waitHandled(ctx, name, n, r.Handler.SequentialBy.Field, id)
	}
	return e.WaitHandled(ctx, name, n)
}

// ReadYourWrites says what a min_position read of the projector name
// waits for: "key" (the document's partition alone: documents_by_key) or
// "all" (every event of its categories).
func ReadYourWrites(h abi.Handler) string {
	if h.DocumentsByKey {
		return "key"
	}
	return "all"
}

func (e *Engine) waitHandled(ctx context.Context, name string, n int64, field, key string) error {
	lastOfKey := map[string]int64{} // what keyed checks found, for the whole wait
	for {
		set := e.Set()
		cats, ok := projectionCategories(set, name)
		if !ok {
			return fmt.Errorf("%w: %s", ErrUnknownProjection, name)
		}
		changed := e.progress.wait()
		done := true
		chk := newCheck(name, n)
		chk.field, chk.key, chk.lastOfKey = field, key, lastOfKey
		for _, c := range cats {
			ok, err := e.caughtUp(ctx, name, c, n, chk)
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
		if e.opts.Positions != nil && (e.opts.Partitioned || e.opts.EventStore) {
			poll = e.after(remotePoll)
		}
	sleep:
		for {
			select {
			case <-ctx.Done():
				return &CaughtUpError{Projection: name, Position: n, Err: ctx.Err()}
			case <-poll:
				break sleep
			case <-changed:
				// Every mark wakes every waiter: check again only once
				// the event this check stopped at is marked (another
				// host's handling shows at the poll), not on every
				// other event's mark.
				if chk.stuck == 0 {
					break sleep
				}
				changed = e.progress.wait() // before the look, so no mark is missed
				if e.progress.has(name, chk.stuckCategory, chk.stuck) {
					break sleep
				}
			}
		}
	}
}

// projectionCategories lists the categories of the events the projector or
// process manager named name handles.
func projectionCategories(set *host.Set, name string) ([]string, bool) {
	r, ok := set.ProjectionRoute(name)
	if !ok {
		return nil, false
	}
	var cats []string
	for _, t := range r.Handler.Handles {
		msg, _ := set.Message(t)
		if msg.Category != "" && !slices.Contains(cats, msg.Category) {
			cats = append(cats, msg.Category)
		}
	}
	return cats, true
}
