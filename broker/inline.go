package broker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
)

// Inline is the in-process broker of the embedded setup. It keeps every
// stream in memory for the life of the process; see the package overview
// for what it guarantees. Its methods are safe for concurrent use.
type Inline struct {
	opts  Options
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger

	mu      sync.Mutex
	closed  bool
	done    chan struct{} // closed by Close
	streams map[string]*streamLog
}

// Compile-time checks of what Inline offers.
var (
	_ Broker       = (*Inline)(nil)
	_ Waiter       = (*Inline)(nil)
	_ Batcher      = (*Inline)(nil)
	_ DeadLetterer = (*Inline)(nil)
	_ Inspector    = (*Inline)(nil)
)

// streamLog is a broker stream: its messages in publish order, indexed by
// sequence number (their index in log), and its groups' positions.
type streamLog struct {
	log    []delivery.Message
	ids    map[string]int // message id -> seq
	groups map[string]*cursor
	// changed is closed, and replaced, whenever a message of the stream may
	// have become ready; Wait blocks on it.
	changed chan struct{}
}

// cursor is one consumer group's position in one stream. A message with
// seq < next was delivered at least once; it is in exactly one of inflight,
// requeued, dead or discarded, or else it was acked. Acked messages are not
// recorded, so a group costs memory only for the messages it has not acked.
type cursor struct {
	next      int
	inflight  map[int]flight
	requeued  []requeue // by seq: the head holds the line
	dead      map[int]deadEntry
	discarded map[int]struct{}
}

type flight struct {
	attempt int
	at      time.Time
}

type requeue struct {
	seq     int
	retries int // nacks so far; the next delivery is attempt retries+1
	readyAt time.Time
}

type deadEntry struct {
	reason   string
	attempts int
	failedAt time.Time
}

// NewInline returns an inline broker with opts, which must be valid.
func NewInline(opts Options) (*Inline, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	b := &Inline{
		opts:    opts,
		now:     clock.Or(opts.Clock).Now,
		after:   clock.Or(opts.Clock).After,
		log:     opts.Logger,
		done:    make(chan struct{}),
		streams: make(map[string]*streamLog),
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	return b, nil
}

// Capabilities returns ReliableMessaging, OrderedMessaging, BlockingRead,
// and DeadLetterQueue unless Options.EnableDLQ is off. It does not claim
// StreamPartitioning: in one process, ordered delivery already serialises
// every key, so sequential_by needs no partitions here.
func (b *Inline) Capabilities() Capability {
	c := ReliableMessaging | OrderedMessaging | BlockingRead
	if b.opts.EnableDLQ {
		c |= DeadLetterQueue
	}
	return c
}

// Publish appends msgs to their streams in the order given, all or none.
// Every message needs an ID and a Stream. A message whose ID its stream
// already holds is dropped, so a relay that publishes a message twice
// (after a crash between publish and mark) delivers it once.
func (b *Inline) Publish(ctx context.Context, msgs ...delivery.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, m := range msgs {
		if m.ID == "" || m.Stream == "" {
			return fmt.Errorf("broker: publish: message %d (id %q, stream %q): %w: id and stream are required", i, m.ID, m.Stream, ErrInvalid)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	var touched []*streamLog
	for _, m := range msgs {
		s := b.streamLocked(m.Stream)
		if _, dup := s.ids[m.ID]; dup {
			continue
		}
		s.ids[m.ID] = len(s.log)
		s.log = append(s.log, clone(m))
		if !slices.Contains(touched, s) {
			touched = append(touched, s)
		}
	}
	for _, s := range touched {
		s.signal()
	}
	return nil
}

// Next delivers the group's next ready message of stream, or returns
// ErrEmpty. A requeued message is delivered before any later message of
// the stream, and until it is ready nothing later is; see the package
// overview. Messages in flight longer than Options.MessageTimeout are
// dead-lettered first.
func (b *Inline) Next(ctx context.Context, stream, group string) (Delivery, error) {
	if err := b.lockGroup(ctx, "next", stream, group); err != nil {
		return Delivery{}, err
	}
	defer b.mu.Unlock()
	d, _, ok := b.nextLocked(stream, group, b.now())
	if !ok {
		return Delivery{}, ErrEmpty
	}
	return d, nil
}

// Wait is Next that blocks until a message is ready for the group, ctx is
// done (it returns ctx.Err()) or the broker is closed (ErrClosed).
func (b *Inline) Wait(ctx context.Context, stream, group string) (Delivery, error) {
	if err := checkGroup("wait", stream, group); err != nil {
		return Delivery{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return Delivery{}, err
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return Delivery{}, ErrClosed
		}
		now := b.now()
		d, readyAt, ok := b.nextLocked(stream, group, now)
		changed := b.streams[stream].changed
		b.mu.Unlock()
		if ok {
			return d, nil
		}
		var ready <-chan time.Time // nil (never) unless a requeued message holds the line
		if !readyAt.IsZero() {
			ready = b.after(readyAt.Sub(now))
		}
		select {
		case <-ctx.Done():
			return Delivery{}, ctx.Err()
		case <-b.done:
			return Delivery{}, ErrClosed
		case <-changed:
		case <-ready:
		}
	}
}

// lockGroup checks the group's names and ctx, then takes b.mu unless the
// broker is closed: on nil the caller holds the lock and must unlock it.
func (b *Inline) lockGroup(ctx context.Context, op, stream, group string) error {
	if err := checkGroup(op, stream, group); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// NextBatch delivers up to max ready messages of the group at once; see
// [Batcher]. max < 1 counts as 1.
func (b *Inline) NextBatch(ctx context.Context, stream, group string, limit int) ([]Delivery, error) {
	if err := b.lockGroup(ctx, "next batch", stream, group); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	now := b.now()
	var out []Delivery
	for len(out) < max(limit, 1) {
		if len(out) > 0 {
			// A redelivery runs alone: stop before it.
			if g := b.streams[stream].groups[group]; len(g.requeued) > 0 && g.requeued[0].retries > 0 {
				break
			}
		}
		d, _, ok := b.nextLocked(stream, group, now)
		if !ok {
			break
		}
		out = append(out, d)
		if d.Attempt > 1 {
			break
		}
	}
	if len(out) == 0 {
		return nil, ErrEmpty
	}
	return out, nil
}

// nextLocked delivers the group's next ready message. When a requeued
// message holds the line it returns the time it becomes ready instead.
func (b *Inline) nextLocked(name, gname string, now time.Time) (d Delivery, readyAt time.Time, ok bool) {
	s := b.streamLocked(name)
	g := s.groups[gname]
	if g == nil {
		g = &cursor{inflight: make(map[int]flight)}
		s.groups[gname] = g
	}
	b.expireLocked(s, name, gname, g, now)
	var seq, attempt int
	switch {
	case len(g.requeued) > 0:
		r := g.requeued[0]
		if now.Before(r.readyAt) {
			return Delivery{}, r.readyAt, false
		}
		g.requeued = slices.Delete(g.requeued, 0, 1)
		seq, attempt = r.seq, r.retries+1
	case g.next < len(s.log):
		seq, attempt = g.next, 1
		g.next++
	default:
		return Delivery{}, time.Time{}, false
	}
	g.inflight[seq] = flight{attempt: attempt, at: now}
	return Delivery{Message: clone(s.log[seq]), Group: gname, Attempt: attempt, DeliveredAt: now}, time.Time{}, true
}

// Ack settles a message delivered to the group. Acking an acked message
// returns nil; acking one never delivered returns ErrNotDelivered, and one
// nacked, dead-lettered or discarded ErrNotInFlight.
func (b *Inline) Ack(ctx context.Context, stream, group, id string) error {
	return b.settle(ctx, "ack", stream, group, id, ErrNotDelivered, func(s *streamLog, g *cursor, seq int, now time.Time) error {
		if _, ok := g.inflight[seq]; ok {
			delete(g.inflight, seq)
			return nil
		}
		if state := g.unsettled(seq); state != "" {
			return fmt.Errorf("%w: %s", ErrNotInFlight, state)
		}
		return nil // acked before
	})
}

// Nack gives a delivered message back. Its retry count grows by one; while
// it is at most Options.MaxRetries the message is redelivered to the group
// after Options.Pause(retries), ahead of the stream's later
// messages. Beyond that it is dead-lettered with ReasonMaxRetries (or
// discarded without a DLQ). Nacking a message that is not in flight but not
// acked returns nil; nacking an acked one ErrAcked, one never delivered
// ErrNotDelivered.
func (b *Inline) Nack(ctx context.Context, stream, group, id string) error {
	return b.nack(ctx, "nack", stream, group, id, false)
}

// Reject dead-letters a delivered message at once with ReasonRejected (or
// discards it without a DLQ); see [Rejecter].
func (b *Inline) Reject(ctx context.Context, stream, group, id string) error {
	return b.nack(ctx, "reject", stream, group, id, true)
}

// nack is Nack, or with reject Reject.
func (b *Inline) nack(ctx context.Context, op, stream, group, id string, reject bool) error {
	return b.settle(ctx, op, stream, group, id, ErrNotDelivered, func(s *streamLog, g *cursor, seq int, now time.Time) error {
		f, ok := g.inflight[seq]
		if !ok {
			if g.unsettled(seq) != "" {
				return nil // nacked before, or already given up on
			}
			return ErrAcked
		}
		delete(g.inflight, seq)
		retries := f.attempt
		if reject {
			b.killLocked(s, stream, group, g, seq, ReasonRejected, f.attempt, now)
			return nil
		}
		if retries > b.opts.MaxRetries {
			b.killLocked(s, stream, group, g, seq, ReasonMaxRetries, f.attempt, now)
			return nil
		}
		g.requeue(requeue{seq: seq, retries: retries, readyAt: now.Add(b.opts.Pause(retries))})
		s.signal()
		return nil
	})
}

// Release gives a delivered message back untried; see [Batcher].
func (b *Inline) Release(ctx context.Context, stream, group, id string) error {
	return b.settle(ctx, "release", stream, group, id, ErrNotDelivered, func(s *streamLog, g *cursor, seq int, now time.Time) error {
		f, ok := g.inflight[seq]
		if !ok {
			if g.unsettled(seq) != "" {
				return nil
			}
			return ErrAcked
		}
		delete(g.inflight, seq)
		g.requeue(requeue{seq: seq, retries: f.attempt - 1, readyAt: now})
		s.signal()
		return nil
	})
}

// Replay moves a message from the group's DLQ back into its line: ahead of
// every message not yet delivered, after any requeued message published
// before it, ready at once and with its attempts reset. It returns
// ErrNotDeadLettered for a message not in the DLQ.
func (b *Inline) Replay(ctx context.Context, stream, group, id string) error {
	return b.settle(ctx, "replay", stream, group, id, ErrNotDeadLettered, func(s *streamLog, g *cursor, seq int, now time.Time) error {
		if _, ok := g.dead[seq]; !ok {
			return ErrNotDeadLettered
		}
		delete(g.dead, seq)
		g.requeue(requeue{seq: seq, readyAt: now})
		s.signal()
		return nil
	})
}

// settle runs fn on a message the group has received, after expiring the
// group's timed-out messages, and wraps its error; for a message the group
// never received the error is missing.
func (b *Inline) settle(ctx context.Context, op, stream, group, id string, missing error, fn func(*streamLog, *cursor, int, time.Time) error) error {
	if err := checkGroup(op, stream, group); err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("broker: %s: stream %s: group %s: %w: empty message id", op, stream, group, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	err := missing
	if s := b.streams[stream]; s != nil {
		if g := s.groups[group]; g != nil {
			if seq, ok := s.ids[id]; ok && seq < g.next {
				now := b.now()
				b.expireLocked(s, stream, group, g, now)
				err = fn(s, g, seq, now)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("broker: %s: stream %s: group %s: message %s: %w", op, stream, group, id, err)
	}
	return nil
}

// DLQ lists the group's dead letters of stream, oldest failure first (ties
// in publish order).
func (b *Inline) DLQ(ctx context.Context, stream, group string) ([]DeadLetter, error) {
	if err := b.lockGroup(ctx, "dlq", stream, group); err != nil {
		return nil, err
	}
	defer b.mu.Unlock()
	s, g := b.lookupLocked(stream, group)
	if g == nil {
		return nil, nil
	}
	b.expireLocked(s, stream, group, g, b.now())
	seqs := make([]int, 0, len(g.dead))
	for seq := range g.dead {
		seqs = append(seqs, seq)
	}
	slices.SortFunc(seqs, func(x, y int) int {
		return cmp.Or(g.dead[x].failedAt.Compare(g.dead[y].failedAt), cmp.Compare(x, y))
	})
	out := make([]DeadLetter, len(seqs))
	for i, seq := range seqs {
		e := g.dead[seq]
		out[i] = DeadLetter{Message: clone(s.log[seq]), Group: group, Reason: e.reason, Attempts: e.attempts, FailedAt: e.failedAt}
	}
	return out, nil
}

// DeadLetter returns the group's dead letter of stream with message id;
// ok is false if that message is not in the group's dead-letter queue
// (not delivered yet, in flight, acked, replayed, or discarded without a
// DLQ). See [DeadLetterFinder].
func (b *Inline) DeadLetter(ctx context.Context, stream, group, id string) (_ DeadLetter, ok bool, _ error) {
	if err := b.lockGroup(ctx, "dlq", stream, group); err != nil {
		return DeadLetter{}, false, err
	}
	defer b.mu.Unlock()
	s, g := b.lookupLocked(stream, group)
	if g == nil {
		return DeadLetter{}, false, nil
	}
	b.expireLocked(s, stream, group, g, b.now())
	seq, ok := s.ids[id]
	if !ok {
		return DeadLetter{}, false, nil
	}
	e, ok := g.dead[seq]
	if !ok {
		return DeadLetter{}, false, nil
	}
	return DeadLetter{Message: clone(s.log[seq]), Group: group, Reason: e.reason, Attempts: e.attempts, FailedAt: e.failedAt}, true, nil
}

// Stats counts the group's messages of stream by state, after expiring
// timed-out ones.
func (b *Inline) Stats(ctx context.Context, stream, group string) (Stats, error) {
	if err := b.lockGroup(ctx, "stats", stream, group); err != nil {
		return Stats{}, err
	}
	defer b.mu.Unlock()
	s, g := b.lookupLocked(stream, group)
	if s == nil {
		return Stats{}, nil
	}
	if g == nil { // a group's first read starts at the stream's first message
		return Stats{Depth: len(s.log)}, nil
	}
	b.expireLocked(s, stream, group, g, b.now())
	return Stats{
		Depth:       len(s.log) - g.next + len(g.requeued),
		Requeued:    len(g.requeued),
		InFlight:    len(g.inflight),
		DeadLetters: len(g.dead),
	}, nil
}

// Close wakes every blocked Wait with ErrClosed; every later call but
// Capabilities and Close returns ErrClosed. Closing twice returns nil.
func (b *Inline) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	return nil
}

func (b *Inline) streamLocked(name string) *streamLog {
	s := b.streams[name]
	if s == nil {
		s = &streamLog{ids: make(map[string]int), groups: make(map[string]*cursor), changed: make(chan struct{})}
		b.streams[name] = s
	}
	return s
}

func (b *Inline) lookupLocked(stream, group string) (*streamLog, *cursor) {
	s := b.streams[stream]
	if s == nil {
		return nil, nil
	}
	return s, s.groups[group]
}

// expireLocked dead-letters the group's messages in flight for longer than
// MessageTimeout.
func (b *Inline) expireLocked(s *streamLog, stream, group string, g *cursor, now time.Time) {
	for seq, f := range g.inflight {
		if now.Sub(f.at) > b.opts.MessageTimeout {
			delete(g.inflight, seq)
			b.killLocked(s, stream, group, g, seq, ReasonTimeout, f.attempt, now)
		}
	}
}

// killLocked dead-letters a message, or discards it without a DLQ.
func (b *Inline) killLocked(s *streamLog, stream, group string, g *cursor, seq int, reason string, attempts int, now time.Time) {
	action := "dead-lettered"
	if b.opts.EnableDLQ {
		if g.dead == nil {
			g.dead = make(map[int]deadEntry)
		}
		g.dead[seq] = deadEntry{reason: reason, attempts: attempts, failedAt: now}
	} else {
		action = "discarded"
		if g.discarded == nil {
			g.discarded = make(map[int]struct{})
		}
		g.discarded[seq] = struct{}{}
	}
	b.log.Warn("broker: message "+action, "stream", stream, "group", group,
		"message_id", s.log[seq].ID, "reason", reason, "attempts", attempts)
}

// unsettled names the state of a delivered message that is neither in
// flight nor acked, or returns "".
func (g *cursor) unsettled(seq int) string {
	if _, ok := slices.BinarySearchFunc(g.requeued, seq, cmpRequeue); ok {
		return "nacked, awaiting redelivery"
	}
	if _, ok := g.dead[seq]; ok {
		return "dead-lettered"
	}
	if _, ok := g.discarded[seq]; ok {
		return "discarded"
	}
	return ""
}

func (g *cursor) requeue(r requeue) {
	i, _ := slices.BinarySearchFunc(g.requeued, r.seq, cmpRequeue)
	g.requeued = slices.Insert(g.requeued, i, r)
}

func cmpRequeue(r requeue, seq int) int { return cmp.Compare(r.seq, seq) }

// signal wakes the stream's waiters.
func (s *streamLog) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func checkGroup(op, stream, group string) error {
	if stream == "" || group == "" {
		return fmt.Errorf("broker: %s: stream %q: group %q: %w: stream and group are required", op, stream, group, ErrInvalid)
	}
	return nil
}
