package redisstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/owner"
	"github.com/proteanhq/protean-host/internal/redispartition"
)

// Options configure a Broker.
type Options struct {
	// Options are the delivery settings (retries, backoff, timeout, DLQ,
	// clock, logger), as for every broker.
	broker.Options
	// Prefix is prepended to every Redis key the broker touches. Production
	// leaves it empty, so keys are exactly the design's names; tests use a
	// prefix of their own.
	Prefix string
	// Epoch makes every Publish require the epoch marker (EpochKey): a
	// Redis that lost its data (restarted empty, a failover to a replica
	// without the marker) refuses publishes with broker.ErrEpochLost until
	// the outbox relay has republished what it may have lost and set the
	// marker again (Broker.SetEpoch). The host turns it on.
	Epoch bool
	// Consumer is this host instance's consumer name in ordinary consumer
	// groups (what XPENDING shows). Default: a new owner.New() name
	// (hostname:pid and a random suffix), unique to this broker.
	Consumer string
	// BlockSlice bounds one blocking read of Wait, and so how long Wait
	// takes to notice a cancelled context or Close (default 200ms).
	BlockSlice time.Duration
	// TrimEvery is how many successful Acks of one stream this instance
	// makes between two trims of it (Trim, run by the Ack that reaches the
	// count). Default 128: a trim costs one script of O(groups + removed
	// entries), so its cost per ack stays small and a stream's acked
	// prefix stays short. Negative: never trim on Ack (call Trim yourself).
	TrimEvery int
	// ConsumerIdle is how long a consumer of an ordinary group must have
	// been idle (XINFO CONSUMERS idle, by Redis's clock: since an entry
	// was last read by or claimed for it) with no pending entries before
	// another consumer of the group deletes it (see SweepConsumers).
	// Every host start is a new consumer name (owner.New), so without
	// this each restart leaves one consumer behind in every group it
	// read. Default 2 × MessageTimeout (10 minutes with the default
	// MessageTimeout): the broker's own bound on how long a holder may
	// stay silent before it counts as dead, doubled so that a consumer
	// of a quiet but live group is seldom deleted and recreated (which
	// is harmless, see SweepConsumers). Negative: never delete.
	ConsumerIdle time.Duration
}

// DefaultTrimEvery is Options.TrimEvery's default.
const DefaultTrimEvery = 128

// consumerIdleFactor times MessageTimeout is Options.ConsumerIdle's
// default.
const consumerIdleFactor = 2

// Broker is the Redis Streams broker. Its methods are safe for concurrent
// use, and several Brokers (host instances) may share one Redis and one
// consumer group.
type Broker struct {
	rdb   redis.UniversalClient
	opts  Options
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger
	trim  *redispartition.Leases // Trim's script, on the same client and prefix

	acksMu sync.Mutex
	acks   map[string]int // successful Acks per stream since its last trim

	sweptMu sync.Mutex
	swept   map[string]time.Time // last consumer sweep per stream and group on this instance

	closeOnce sync.Once
	done      chan struct{}
}

// Compile-time checks of what Broker offers.
var (
	_ broker.Broker       = (*Broker)(nil)
	_ broker.Waiter       = (*Broker)(nil)
	_ broker.DeadLetterer = (*Broker)(nil)
	_ broker.Inspector    = (*Broker)(nil)
	_ broker.Batcher      = (*Broker)(nil)
)

// New returns a broker on client, which the caller owns (Close does not
// close it). opts.Options must be valid.
func New(client redis.UniversalClient, opts Options) (*Broker, error) {
	if client == nil {
		return nil, errors.New("redisstream: nil client")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Consumer == "" {
		opts.Consumer = owner.New()
	}
	if opts.BlockSlice <= 0 {
		opts.BlockSlice = 200 * time.Millisecond
	}
	if opts.TrimEvery == 0 {
		opts.TrimEvery = DefaultTrimEvery
	}
	if opts.ConsumerIdle == 0 {
		opts.ConsumerIdle = consumerIdleFactor * opts.MessageTimeout
	}
	b := &Broker{rdb: client, opts: opts, now: clock.Or(opts.Clock).Now, after: clock.Or(opts.Clock).After, log: opts.Logger, done: make(chan struct{}),
		trim: redispartition.NewLeases(client, opts.Prefix), acks: make(map[string]int), swept: make(map[string]time.Time)}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	return b, nil
}

// Capabilities returns ReliableMessaging, OrderedMessaging, BlockingRead,
// StreamPartitioning, and DeadLetterQueue unless Options.EnableDLQ is off.
func (b *Broker) Capabilities() broker.Capability {
	c := broker.ReliableMessaging | broker.OrderedMessaging | broker.BlockingRead | broker.StreamPartitioning
	if b.opts.EnableDLQ {
		c |= broker.DeadLetterQueue
	}
	return c
}

// Close makes every later call but Capabilities and Close return
// broker.ErrClosed and ends blocked Waits within one BlockSlice. It does
// not close the Redis client.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() { close(b.done) })
	return nil
}

func (b *Broker) closed() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// check returns the error a call must return before it starts.
func (b *Broker) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.closed() {
		return broker.ErrClosed
	}
	return nil
}

// Key names (without Prefix). The stream is the caller's name; the rest
// sit beside it.
func idsKey(stream string) string          { return redispartition.IDIndexKey(stream) }
func dlqKey(stream string) string          { return stream + ":dlq" }
func groupKey(stream, group string) string { return stream + ":__group__:" + group }

// Category returns msg.Category, or the part of EventStream before its
// first '-'.
func Category(msg delivery.Message) string {
	if msg.Category != "" {
		return msg.Category
	}
	c, _, _ := strings.Cut(msg.EventStream, "-")
	return c
}

// Publish appends msgs to their streams with one Lua script: all or
// nothing, in the order given. A message whose ID its stream still holds
// is dropped (a relay's republish after a crash delivers once, unless every
// group acked the first copy and a trim removed it: see Trim). A message
// with a PartitionKey also adds the key to its category's partition index
// ({category}:__partitions__) in the same script, so a reaper that sees
// the index never misses a stream that has entries. It returns the entry
// ids, "" for a dropped duplicate.
func (b *Broker) Publish(ctx context.Context, msgs ...delivery.Message) error {
	_, err := b.publish(ctx, "", msgs)
	return err
}

// PublishIn is Publish that, with Options.Epoch, publishes only while the
// epoch marker holds epoch (broker.Epocher).
func (b *Broker) PublishIn(ctx context.Context, epoch string, msgs ...delivery.Message) error {
	_, err := b.publish(ctx, epoch, msgs)
	return err
}

// PublishIDs is Publish that returns the Redis entry ids, "" for each
// dropped duplicate.
func (b *Broker) PublishIDs(ctx context.Context, msgs ...delivery.Message) ([]string, error) {
	return b.publish(ctx, "", msgs)
}

func (b *Broker) publish(ctx context.Context, epoch string, msgs []delivery.Message) ([]string, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, 4*len(msgs)+1)
	args := make([]any, 0, 24*len(msgs)+2)
	args = append(args, wakeMaxLen)
	for i, m := range msgs {
		if m.ID == "" || m.Stream == "" {
			return nil, fmt.Errorf("redisstream: publish: message %d (id %q, stream %q): %w: id and stream are required", i, m.ID, m.Stream, broker.ErrInvalid)
		}
		idx, wake := b.opts.Prefix+m.Stream, b.opts.Prefix+m.Stream
		if m.PartitionKey != "" {
			c := Category(m)
			if c == "" {
				return nil, fmt.Errorf("redisstream: publish: message %s: %w: partition key %q without a category", m.ID, broker.ErrInvalid, m.PartitionKey)
			}
			idx, wake = b.opts.Prefix+redispartition.IndexKey(c), b.opts.Prefix+redispartition.WakeKey(c)
		}
		keys = append(keys, b.opts.Prefix+m.Stream, b.opts.Prefix+idsKey(m.Stream), idx, wake)
		f := Encode(m)
		args = append(args, m.ID, m.PartitionKey, len(f))
		args = append(args, f...)
	}
	if b.opts.Epoch {
		keys = append(keys, b.opts.Prefix+EpochKey)
		args = append(args, epoch)
	}
	res, err := publishScript.Run(ctx, b.rdb, keys, args...).StringSlice()
	if err != nil {
		switch {
		case strings.HasPrefix(err.Error(), "NOEPOCH"):
			err = fmt.Errorf("%w: %v", broker.ErrEpochLost, err)
		case strings.HasPrefix(err.Error(), "RESTARTED"):
			err = fmt.Errorf("%w: %v", broker.ErrRestarted, err)
		}
		return nil, fmt.Errorf("redisstream: publish %d messages (first %s to %s): %w", len(msgs), msgs[0].ID, msgs[0].Stream, err)
	}
	return res, nil
}

// wakeMaxLen is about how many entries a category's wake-up stream keeps
// (redispartition.WakeMaxLen).
const wakeMaxLen = redispartition.WakeMaxLen

// EpochKey (with Options.Prefix) is the epoch marker: a string the outbox
// relay sets once it has made sure that everything published before it is
// in this Redis, or published again. A Redis that comes back without it
// lost what it held.
const EpochKey = "protean:epoch"

// Epoch returns the epoch of the marker, "" if this Redis has none, and
// whether the server restarted since the marker was set (its run_id is
// not the marker's; a marker of an older host, without a run_id, counts
// as set before a restart).
func (b *Broker) Epoch(ctx context.Context) (string, bool, error) {
	res, err := epochScript.Run(ctx, b.rdb, []string{b.opts.Prefix + EpochKey}).StringSlice()
	if err != nil {
		return "", false, fmt.Errorf("redisstream: epoch: %w", err)
	}
	if len(res) != 2 {
		return "", false, fmt.Errorf("redisstream: epoch: unexpected reply %q", res)
	}
	mark, run := res[0], res[1]
	if mark == "" {
		return "", false, nil
	}
	epoch, at, found := strings.Cut(mark, "@")
	return epoch, !found || at != run, nil
}

// SetEpoch sets the epoch marker to epoch, under the server's current
// run_id.
func (b *Broker) SetEpoch(ctx context.Context, epoch string) error {
	if strings.Contains(epoch, "@") {
		return fmt.Errorf("redisstream: set epoch %q: %w: no '@' in an epoch", epoch, broker.ErrInvalid)
	}
	if err := setEpochScript.Run(ctx, b.rdb, []string{b.opts.Prefix + EpochKey}, epoch).Err(); err != nil {
		return fmt.Errorf("redisstream: set epoch: %w", err)
	}
	return nil
}

// reply is a group script's reply.
type reply struct {
	status string
	rest   []any
}

// run runs a group script for stream and group with extra ARGV, logs what
// it dead-lettered, and returns its reply.
func (b *Broker) run(ctx context.Context, s *redis.Script, op, stream, group string, now time.Time, extra ...any) (reply, error) {
	p := b.opts.Prefix
	g := groupKey(stream, group)
	keys := []string{p + stream, p + g, p + g + ":requeued", p + g + ":inflight", p + dlqKey(stream), p + idsKey(stream), p + g + ":wake"}
	ns, nn := timePair(now)
	cs, cn := timePair(now.Add(-b.opts.MessageTimeout))
	dlq := "0"
	if b.opts.EnableDLQ {
		dlq = "1"
	}
	args := append([]any{group, b.opts.Consumer, ns, nn, cs, cn, dlq}, extra...)
	v, err := s.Run(ctx, b.rdb, keys, args...).Slice()
	if err != nil {
		return reply{}, err
	}
	if len(v) < 2 {
		return reply{}, fmt.Errorf("redisstream: %s: stream %s: group %s: short script reply %v", op, stream, group, v)
	}
	st, _ := v[0].(string)
	killed, _ := v[1].([]any)
	for i := 0; i+2 < len(killed); i += 3 {
		action := "dead-lettered"
		if !b.opts.EnableDLQ {
			action = "discarded"
		}
		b.log.Warn("broker: message "+action, "stream", stream, "group", group,
			"message_id", killed[i], "reason", killed[i+1], "attempts", killed[i+2])
	}
	return reply{status: st, rest: v[2:]}, nil
}

func isNoGroup(err error) bool { return err != nil && strings.Contains(err.Error(), "NOGROUP") }

// next runs the next script, creating the group (from the stream's first
// entry) when it does not exist yet.
func (b *Broker) next(ctx context.Context, stream, group string, now time.Time) (reply, error) {
	return b.read(ctx, nextScript, "next", stream, group, now)
}

// read runs a delivering script (next, batch), creating the group (from
// the stream's first entry) when it does not exist yet.
func (b *Broker) read(ctx context.Context, s *redis.Script, op, stream, group string, now time.Time, extra ...any) (reply, error) {
	r, err := b.run(ctx, s, op, stream, group, now, extra...)
	if isNoGroup(err) {
		err = b.rdb.XGroupCreateMkStream(ctx, b.opts.Prefix+stream, group, "0").Err()
		if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			return reply{}, fmt.Errorf("redisstream: create group: stream %s: group %s: %w", stream, group, err)
		}
		r, err = b.run(ctx, s, op, stream, group, now, extra...)
	}
	if err != nil {
		return reply{}, fmt.Errorf("redisstream: %s: stream %s: group %s: %w", op, stream, group, err)
	}
	if b.sweepDue(stream, group, now) {
		// A failed sweep costs nothing but clutter: the next one retries.
		if _, err := b.SweepConsumers(ctx, stream, group); err != nil {
			b.log.Warn("broker: consumer sweep failed", "stream", stream, "group", group, "error", err)
		}
	}
	return r, nil
}

// sweepDue reports whether this instance should sweep the consumers of
// stream's group now: on its first read of the group and then at most
// every ConsumerIdle/2, so a dead consumer goes within 1.5 × ConsumerIdle
// of its last read while a busy group pays one XINFO CONSUMERS per
// interval, not per read.
func (b *Broker) sweepDue(stream, group string, now time.Time) bool {
	if b.opts.ConsumerIdle < 0 {
		return false
	}
	k := stream + "\x00" + group
	b.sweptMu.Lock()
	defer b.sweptMu.Unlock()
	if last, ok := b.swept[k]; ok && now.Sub(last) < b.opts.ConsumerIdle/2 {
		return false
	}
	b.swept[k] = now
	return true
}

// SweepConsumers deletes the consumers of group on stream that have no
// pending entries and have been idle longer than Options.ConsumerIdle,
// never this broker's own, and returns their names; each deletion is
// logged at INFO. Reads run it by themselves (see Options.ConsumerIdle).
//
// A consumer with pending entries is never deleted: XGROUP DELCONSUMER
// drops its pending entries, and with them the trim's hold on the
// entries (see Trimming), so its messages could be trimmed away
// unsettled. Its entries leave its list when they are settled: acked,
// dead-lettered or discarded by MessageTimeout, or nacked and redelivered
// to another consumer (XCLAIM); the sweep after that deletes it. The
// check and the deletion are one script, so no read of the consumer falls
// between them. Deleting a live consumer that was merely idle is
// harmless: its next read (XREADGROUP or XCLAIM, in the next and batch
// scripts) creates it again, and the group's delivery state (its hash
// and sorted sets) is keyed by entry, not by consumer.
func (b *Broker) SweepConsumers(ctx context.Context, stream, group string) ([]string, error) {
	if err := checkGroup("sweep consumers", stream, group); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if b.opts.ConsumerIdle < 0 {
		return nil, nil
	}
	v, err := sweepScript.Run(ctx, b.rdb, []string{b.opts.Prefix + stream}, group, b.opts.Consumer, b.opts.ConsumerIdle.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstream: sweep consumers: stream %s: group %s: %w", stream, group, err)
	}
	var out []string
	for i := 0; i+1 < len(v); i += 2 {
		name, _ := v[i].(string)
		idle, _ := v[i+1].(int64)
		b.log.Info("broker: deleted idle consumer", "stream", stream, "group", group, "consumer", name,
			"idle_ms", idle, "consumer_idle_ms", b.opts.ConsumerIdle.Milliseconds())
		out = append(out, name)
	}
	return out, nil
}

// delivery decodes a "msg" reply.
func (b *Broker) delivery(stream, group string, now time.Time, r reply) (broker.Delivery, error) {
	if len(r.rest) < 3 {
		return broker.Delivery{}, fmt.Errorf("redisstream: next: stream %s: group %s: short reply %v", stream, group, r.rest)
	}
	eid, _ := r.rest[0].(string)
	fields, _ := r.rest[1].([]any)
	attempt, _ := r.rest[2].(int64)
	m, err := decodeFlat(eid, fields)
	if err != nil {
		return broker.Delivery{}, fmt.Errorf("redisstream: next: stream %s: group %s: %w", stream, group, err)
	}
	m.Stream = stream
	return broker.Delivery{Message: m, Group: group, Attempt: int(attempt), DeliveredAt: now}, nil
}

// Next delivers the group's next ready message of stream, or returns
// broker.ErrEmpty: the head of the group's requeued line when it is due
// (while it is not, nothing later is delivered: it holds the line), else a
// new entry. Messages in flight longer than MessageTimeout are dead-lettered
// first. A malformed entry is returned as a *DecodeError (ErrMalformed);
// without a message id to Nack it by, it stays in flight until
// MessageTimeout dead-letters it, and does not block the group meanwhile.
func (b *Broker) Next(ctx context.Context, stream, group string) (broker.Delivery, error) {
	if err := checkGroup("next", stream, group); err != nil {
		return broker.Delivery{}, err
	}
	if err := b.check(ctx); err != nil {
		return broker.Delivery{}, err
	}
	now := b.now()
	r, err := b.next(ctx, stream, group, now)
	if err != nil {
		return broker.Delivery{}, err
	}
	if r.status != "msg" {
		return broker.Delivery{}, broker.ErrEmpty
	}
	return b.delivery(stream, group, now, r)
}

// Wait is Next that blocks until a message is ready, ctx is done or the
// broker is closed. It blocks in Redis (XREAD BLOCK on the stream and on
// the group's wake stream, which Nack and Replay write to), in slices of
// BlockSlice so that it notices ctx and Close; while a requeued message
// holds the line it waits for the message's due time on Options.After,
// rechecking once a slice for a Replay by another instance.
func (b *Broker) Wait(ctx context.Context, stream, group string) (broker.Delivery, error) {
	if err := checkGroup("wait", stream, group); err != nil {
		return broker.Delivery{}, err
	}
	var (
		timer   <-chan time.Time
		timerAt time.Time
	)
	for {
		if err := b.check(ctx); err != nil {
			return broker.Delivery{}, err
		}
		now := b.now()
		r, err := b.next(ctx, stream, group, now)
		if err != nil {
			if ctx.Err() != nil {
				return broker.Delivery{}, ctx.Err()
			}
			return broker.Delivery{}, err
		}
		switch r.status {
		case "msg":
			return b.delivery(stream, group, now, r)
		case "held":
			s, _ := r.rest[0].(string)
			due, err := parsePair(s)
			if err != nil {
				return broker.Delivery{}, fmt.Errorf("redisstream: wait: stream %s: group %s: %w", stream, group, err)
			}
			if timer == nil || !due.Equal(timerAt) {
				timer, timerAt = b.after(due.Sub(now)), due
			}
			select {
			case <-ctx.Done():
				return broker.Delivery{}, ctx.Err()
			case <-b.done:
				return broker.Delivery{}, broker.ErrClosed
			case <-timer:
				timer = nil
			case <-time.After(b.opts.BlockSlice):
			}
		default: // empty
			timer = nil
			lastS, _ := r.rest[0].(string)
			lastW, _ := r.rest[1].(string)
			if err := b.block(ctx, stream, group, lastS, lastW); err != nil {
				return broker.Delivery{}, err
			}
		}
	}
}

// block waits up to one BlockSlice (less if ctx's deadline is nearer) for
// an entry after lastS on the stream or after lastW on the wake stream. It
// reads without a group, so it takes nothing: Next does the delivering.
func (b *Broker) block(ctx context.Context, stream, group, lastS, lastW string) error {
	d := b.opts.BlockSlice
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	if d < time.Millisecond {
		if d <= 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		d = time.Millisecond // BLOCK 0 would block for ever
	}
	p := b.opts.Prefix
	err := b.rdb.XRead(ctx, &redis.XReadArgs{
		Streams: []string{p + stream, p + groupKey(stream, group) + ":wake", lastS, lastW},
		Count:   1,
		Block:   d,
	}).Err()
	switch {
	case err == nil, errors.Is(err, redis.Nil):
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		return fmt.Errorf("redisstream: wait: stream %s: group %s: %w", stream, group, err)
	}
}

// settle runs an Ack, Nack or Replay script and maps its status.
func (b *Broker) settle(ctx context.Context, op, stream, group, id string, s *redis.Script, extra ...any) (reply, error) {
	if err := checkGroup(op, stream, group); err != nil {
		return reply{}, err
	}
	if id == "" {
		return reply{}, fmt.Errorf("redisstream: %s: stream %s: group %s: %w: empty message id", op, stream, group, broker.ErrInvalid)
	}
	if err := b.check(ctx); err != nil {
		return reply{}, err
	}
	r, err := b.run(ctx, s, op, stream, group, b.now(), append([]any{id}, extra...)...)
	if err != nil {
		return reply{}, fmt.Errorf("redisstream: %s: stream %s: group %s: message %s: %w", op, stream, group, id, err)
	}
	var serr error
	switch r.status {
	case "ok":
		return r, nil
	case "not_delivered":
		serr = broker.ErrNotDelivered
	case "acked":
		serr = broker.ErrAcked
	case "not_dead":
		serr = broker.ErrNotDeadLettered
	case "not_in_flight":
		detail := ""
		if len(r.rest) > 0 {
			detail, _ = r.rest[0].(string)
		}
		serr = fmt.Errorf("%w: %s", broker.ErrNotInFlight, detail)
	default:
		serr = fmt.Errorf("unexpected script status %q", r.status)
	}
	return r, fmt.Errorf("redisstream: %s: stream %s: group %s: message %s: %w", op, stream, group, id, serr)
}

// Ack settles a delivered message (XACK). Acking an acked message returns
// nil (broker.ErrNotDelivered once a trim has removed it); one never
// delivered broker.ErrNotDelivered; one nacked,
// dead-lettered or discarded broker.ErrNotInFlight.
//
// Every Options.TrimEvery successful Acks of a stream, the Ack also trims
// the stream (see Trim); a failed trim is logged, not returned: the ack
// itself took effect, and the next trim removes what this one left.
func (b *Broker) Ack(ctx context.Context, stream, group, id string) error {
	if _, err := b.settle(ctx, "ack", stream, group, id, ackScript); err != nil {
		return err
	}
	if b.opts.TrimEvery > 0 && b.countAck(stream) {
		if n, err := b.Trim(ctx, stream); err != nil {
			b.log.Warn("broker: trim failed", "stream", stream, "error", err)
		} else if n > 0 {
			b.log.Debug("broker: trimmed", "stream", stream, "entries", n)
		}
	}
	return nil
}

// countAck counts an Ack of stream and reports whether it is time to trim.
// The map holds one small counter per stream this instance acks on.
func (b *Broker) countAck(stream string) bool {
	b.acksMu.Lock()
	defer b.acksMu.Unlock()
	b.acks[stream]++
	if b.acks[stream] < b.opts.TrimEvery {
		return false
	}
	b.acks[stream] = 0
	return true
}

// Trim removes the entries of stream that every consumer group of it has
// acked, with their fields in the id index, and returns how many it
// removed: package partition's Leases.Trim, the one trimming rule for
// ordinary and partition streams. A stream without a group is not trimmed;
// retention is "until every existing group acked it", so a group created
// later starts at the entries left. Dead letters survive the trim of their
// entries (see the DLQ copy kept by Replay).
func (b *Broker) Trim(ctx context.Context, stream string) (int64, error) {
	if stream == "" {
		return 0, fmt.Errorf("redisstream: trim: %w: stream is required", broker.ErrInvalid)
	}
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	n, err := b.trim.Trim(ctx, stream)
	if err != nil {
		return n, fmt.Errorf("redisstream: trim: stream %s: %w", stream, err)
	}
	return n, nil
}

// Nack gives a delivered message back: it is requeued at its place in the
// group's line, due after Options.Pause(retries) (the cap and the
// jitter applied in the script), or, past
// MaxRetries, dead-lettered (XADD to {stream}:dlq and XACK in one script)
// or discarded without a DLQ. The message stays in the group's pending
// entries list while it waits.
func (b *Broker) Nack(ctx context.Context, stream, group, id string) error {
	_, err := b.settle(ctx, "nack", stream, group, id, nackScript,
		b.opts.MaxRetries, int64(b.opts.Delay), strconv.FormatFloat(delivery.BackoffFactor, 'g', -1, 64),
		int64(b.opts.MaxDelay), strconv.FormatFloat(b.opts.JitterFactor(), 'g', -1, 64), broker.ReasonMaxRetries)
	return err
}

// Reject dead-letters a delivered message at once with
// broker.ReasonRejected (or discards it without a DLQ): the nack script
// with no retries left.
func (b *Broker) Reject(ctx context.Context, stream, group, id string) error {
	_, err := b.settle(ctx, "reject", stream, group, id, nackScript, -1, 0, "1", 0, "1", broker.ReasonRejected)
	return err
}

// Replay moves a dead letter back to the head of the group's line (in
// entry order among requeued messages), due at once, attempts reset.
func (b *Broker) Replay(ctx context.Context, stream, group, id string) error {
	_, err := b.settle(ctx, "replay", stream, group, id, replayScript)
	return err
}

// DLQ lists the group's dead letters of stream ({stream}:dlq holds every
// group's), oldest failure first.
func (b *Broker) DLQ(ctx context.Context, stream, group string) ([]broker.DeadLetter, error) {
	if err := checkGroup("dlq", stream, group); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	r, err := b.run(ctx, dlqScript, "dlq", stream, group, b.now())
	if err != nil {
		return nil, fmt.Errorf("redisstream: dlq: stream %s: group %s: %w", stream, group, err)
	}
	var entries []any
	if len(r.rest) > 0 {
		entries, _ = r.rest[0].([]any)
	}
	var out []broker.DeadLetter
	for _, e := range entries {
		pair, _ := e.([]any)
		if len(pair) < 2 {
			continue
		}
		did, _ := pair[0].(string)
		flat, _ := pair[1].([]any)
		vals := flatMap(flat)
		if g, _ := vals["dl_group"].(string); g != group {
			continue
		}
		dl, err := b.deadLetter(stream, did, vals)
		if err != nil {
			return nil, fmt.Errorf("redisstream: dlq: stream %s: group %s: %w", stream, group, err)
		}
		out = append(out, dl.DeadLetter)
	}
	return out, nil
}

// deadLetter decodes entry did of stream's DLQ stream.
func (b *Broker) deadLetter(stream, did string, vals map[string]any) (DeadLetter, error) {
	group, _ := vals["dl_group"].(string)
	m, err := Decode(did, vals)
	if err != nil {
		// A poison message is exactly what a DLQ is for: list what
		// can be read of it rather than hide it or fail the listing.
		b.log.Warn("broker: malformed dead letter", "stream", stream, "group", group, "entry", did, "error", err)
		m = delivery.Message{ID: did}
		if id, ok := vals[FieldID].(string); ok && id != "" {
			m.ID = id
		}
	}
	m.Stream = stream
	dl := DeadLetter{DeadLetter: broker.DeadLetter{Message: m, Group: group}}
	dl.Reason, _ = vals["dl_reason"].(string)
	a, _ := vals["dl_attempts"].(string)
	dl.Attempts, _ = strconv.Atoi(a)
	dl.Unit, _ = vals["dl_unit"].(string)
	fa, _ := vals["dl_failed_at"].(string)
	if dl.FailedAt, err = parsePair(fa); err != nil {
		return DeadLetter{}, fmt.Errorf("entry %s: %w", did, err)
	}
	return dl, nil
}

// DeadLetter is a dead letter as a DLQ stream keeps it: a consumer
// group's, or a partition's.
type DeadLetter struct {
	broker.DeadLetter
	// Unit is the partition unit of a partition's dead letter (moved to
	// "{category}:{key}:dlq" by an operator, redispartition.Admin.DLQ),
	// "" for a consumer group's. Replay does not take a partition's: its
	// workers read by global position, not through a group's requeue.
	Unit string
}

// DeadLetters lists the dead letters of stream's DLQ stream, or with
// stream "" of every DLQ stream under the prefix ({prefix}*:dlq, found by
// SCAN, so the groups and partitions that wrote them need not be known):
// every group's and every partition's, at most perStream of each stream,
// oldest first, streams in name order. Unlike DLQ it does not first
// dead-letter a group's timed-out messages; the group's next read does.
func (b *Broker) DeadLetters(ctx context.Context, stream string, perStream int) ([]DeadLetter, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if perStream <= 0 {
		return nil, fmt.Errorf("redisstream: dead letters: %w: perStream must be > 0, got %d", broker.ErrInvalid, perStream)
	}
	streams := []string{stream}
	if stream == "" {
		var err error
		if streams, err = b.deadLetterStreams(ctx); err != nil {
			return nil, err
		}
	}
	var out []DeadLetter
	for _, s := range streams {
		es, err := b.rdb.XRangeN(ctx, b.opts.Prefix+dlqKey(s), "-", "+", int64(perStream)).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstream: dead letters: stream %s: %w", s, err)
		}
		for _, e := range es {
			dl, err := b.deadLetter(s, e.ID, e.Values)
			if err != nil {
				return nil, fmt.Errorf("redisstream: dead letters: stream %s: %w", s, err)
			}
			out = append(out, dl)
		}
	}
	return out, nil
}

// deadLetterStreams names the streams (without the prefix) that have a
// DLQ stream, in name order.
func (b *Broker) deadLetterStreams(ctx context.Context) ([]string, error) {
	p := b.opts.Prefix
	var out []string
	// TYPE stream: a group named "dlq" has a hash "{stream}:__group__:dlq".
	iter := b.rdb.ScanType(ctx, 0, redispartition.GlobEscape(p)+"*:dlq", 1000, "stream").Iterator()
	for iter.Next(ctx) {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(iter.Val(), p), ":dlq"))
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("redisstream: dead letters: scan for DLQ streams: %w", err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Stats counts the group's messages of stream by state, after expiring
// timed-out ones. Depth uses the group's lag (Redis 7).
func (b *Broker) Stats(ctx context.Context, stream, group string) (broker.Stats, error) {
	if err := checkGroup("stats", stream, group); err != nil {
		return broker.Stats{}, err
	}
	if err := b.check(ctx); err != nil {
		return broker.Stats{}, err
	}
	r, err := b.run(ctx, statsScript, "stats", stream, group, b.now())
	if err != nil {
		return broker.Stats{}, fmt.Errorf("redisstream: stats: stream %s: group %s: %w", stream, group, err)
	}
	n := make([]int, 4)
	for i := range n {
		if i < len(r.rest) {
			v, _ := r.rest[i].(int64)
			n[i] = int(v)
		}
	}
	return broker.Stats{Depth: n[0], Requeued: n[1], InFlight: n[2], DeadLetters: n[3]}, nil
}

func checkGroup(op, stream, group string) error {
	if stream == "" || group == "" {
		return fmt.Errorf("redisstream: %s: stream %q: group %q: %w: stream and group are required", op, stream, group, broker.ErrInvalid)
	}
	return nil
}
