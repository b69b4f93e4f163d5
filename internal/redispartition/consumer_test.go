package redispartition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/faultproxy"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// effects is a native handler whose "effects" are an applied log,
// committed with the unit's fenced position in one memory transaction, as
// the engine commits real effects with the unit of work. It records every
// overlap of two batches of one unit.
type effects struct {
	store *position.Memory

	mu       sync.Mutex
	applied  map[string][]int64 // unit -> global positions, in commit order
	inFlight map[string]int
	overlaps []string
	// calls counts Handle calls per message id (attempts).
	calls map[string]int
	// fail decides a message's error; nil handles it.
	fail func(m delivery.Message, attempt int) error
	// gate, if set, is called before a batch commits (to stall an owner).
	gate func(ctx context.Context, b delivery.Batch)
}

func newEffects(store *position.Memory) *effects {
	return &effects{store: store, applied: map[string][]int64{}, inFlight: map[string]int{}, calls: map[string]int{}}
}

func (h *effects) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	h.mu.Lock()
	h.inFlight[b.Unit]++
	if h.inFlight[b.Unit] > 1 {
		h.overlaps = append(h.overlaps, b.Unit)
	}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight[b.Unit]--
		h.mu.Unlock()
	}()
	if h.gate != nil {
		h.gate(ctx, b)
	}
	done := len(b.Messages)
	var herr error
	for i, m := range b.Messages {
		h.mu.Lock()
		h.calls[m.ID]++
		attempt := h.calls[m.ID]
		h.mu.Unlock()
		if h.fail != nil {
			if err := h.fail(m, attempt); err != nil {
				done, herr = i, err
				break
			}
		}
	}
	if done == 0 {
		return 0, herr
	}
	tx := h.store.Begin()
	defer tx.Rollback()
	fence := partitionFence(b)
	fence.Advance[b.Source] = b.Messages[done-1].GlobalPosition
	if err := tx.Advance(ctx, fence); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	h.mu.Lock()
	for _, m := range b.Messages[:done] {
		h.applied[b.Unit] = append(h.applied[b.Unit], m.GlobalPosition)
	}
	h.mu.Unlock()
	return done, herr
}

func (h *effects) snapshot() (map[string][]int64, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]int64{}
	for k, v := range h.applied {
		out[k] = append([]int64(nil), v...)
	}
	return out, append([]string(nil), h.overlaps...)
}

// publisher appends messages to partition streams with increasing global
// positions, as the outbox relay does through the broker.
type publisher struct {
	t      *testing.T
	rdb    *redis.Client
	prefix string
	mu     sync.Mutex
	gp     int64
	sent   map[string][]int64 // unit -> positions
	last   map[string]int64   // stream -> global position of its last message (each message's prev)
}

func (p *publisher) publish(category, key string, n int) {
	p.t.Helper()
	for i := 0; i < n; i++ {
		p.mu.Lock()
		p.gp++
		gp := p.gp
		if p.last == nil {
			p.last = map[string]int64{}
		}
		stream := partition.StreamName(category, key)
		prev := p.last[stream]
		p.last[stream] = gp
		p.mu.Unlock()
		msg := delivery.Message{ID: fmt.Sprintf("m-%d", gp), Type: "Happened", Category: category, EventStream: category + "-" + key,
			Data: []byte(`{"k":"` + key + `"}`), GlobalPosition: gp, PartitionKey: key, Prev: prev}
		ctx := context.Background()
		_, err := p.rdb.XAdd(ctx, &redis.XAddArgs{Stream: p.prefix + partition.StreamName(category, key), Values: redisstream.Encode(msg)}).Result()
		require.NoError(p.t, err)
		require.NoError(p.t, p.rdb.SAdd(ctx, p.prefix+redispartition.IndexKey(category), key).Err())
		p.mu.Lock()
		unit := partition.PartitionUnit(category, key)
		p.sent[unit] = append(p.sent[unit], gp)
		p.mu.Unlock()
	}
}

// lose is a message the relay published and the stream then lost (a
// Redis that dropped an acknowledged write): its position is taken and the
// next message's prev names it, but the stream never holds it.
func (p *publisher) lose(category, key string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gp++
	if p.last == nil {
		p.last = map[string]int64{}
	}
	p.last[partition.StreamName(category, key)] = p.gp
	return p.gp
}

type rig struct {
	t      *testing.T
	rdb    *redis.Client
	prefix string
	leases *redispartition.Leases
	store  *position.Memory
	pub    *publisher
}

func newRig(t *testing.T) *rig {
	ls, rdb, prefix := newLeases(t)
	return &rig{t: t, rdb: rdb, prefix: prefix, leases: ls, store: position.NewMemory(nil),
		pub: &publisher{t: t, rdb: rdb, prefix: prefix, sent: map[string][]int64{}}}
}

func (r *rig) consumer(owner string, h delivery.Handler, ttl time.Duration, tweak ...func(*redispartition.ConsumerOptions)) *redispartition.Consumer {
	opts := r.options(owner, h, ttl)
	for _, f := range tweak {
		f(&opts)
	}
	c, err := redispartition.NewConsumer(opts)
	require.NoError(r.t, err)
	return c
}

// options are the rig's consumer options.
func (r *rig) options(owner string, h delivery.Handler, ttl time.Duration) redispartition.ConsumerOptions {
	return redispartition.ConsumerOptions{
		Leases: r.leases, Positions: r.store, Handler: h, Decode: redisstream.Decode, Owner: owner,
		Subscriptions: func() []partition.Subscription {
			return []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}
		},
		LeaseTTL: ttl, Heartbeat: ttl / 5, Poll: 5 * time.Millisecond, ReapIdle: time.Hour,
		Retry: delivery.Policy{MaxRetries: 2, Delay: time.Millisecond}, BatchSize: 8,
	}
}

func start(t *testing.T, c *redispartition.Consumer) {
	t.Helper()
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
}

// waitApplied waits until every published message was applied.
func (r *rig) waitApplied(h *effects) {
	r.t.Helper()
	testwait.For(r.t, "every published message applied", func() (bool, string) {
		got, _ := h.snapshot()
		r.pub.mu.Lock()
		defer r.pub.mu.Unlock()
		for unit, sent := range r.pub.sent {
			if len(got[unit]) < len(sent) {
				return false, fmt.Sprintf("%s: applied %d of %d", unit, len(got[unit]), len(sent))
			}
		}
		return true, ""
	})
}

// requireExactlyOnceInOrder checks that each unit's applied log is exactly
// what was published to it, in order.
func (r *rig) requireExactlyOnceInOrder(h *effects) {
	r.t.Helper()
	got, overlaps := h.snapshot()
	require.Empty(r.t, overlaps, "two batches of one partition ran at once")
	r.pub.mu.Lock()
	defer r.pub.mu.Unlock()
	for unit, sent := range r.pub.sent {
		require.Equal(r.t, sent, got[unit], "partition %s: applied log differs from publish order", unit)
	}
}

func TestConsumerHandlesEachKeyInOrderAcrossInstances(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	for k := 0; k < 6; k++ {
		r.pub.publish("order", "c-"+strconv.Itoa(k), 5)
	}
	a := r.consumer("host-a", h, 2*time.Second)
	b := r.consumer("host-b", h, 2*time.Second)
	start(t, a)
	start(t, b)
	for k := 0; k < 6; k++ {
		r.pub.publish("order", "c-"+strconv.Itoa(k), 5)
	}
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	require.Len(t, append(a.Owned(), b.Owned()...), 6, "each partition owned by exactly one instance")
	// Idle workers trim what every group acked: a busy key's stream does
	// not grow without bound.
	testwait.For(t, "the partition streams trimmed", func() (bool, string) {
		for k := 0; k < 6; k++ {
			n, err := r.rdb.XLen(context.Background(), r.prefix+partition.StreamName("order", "c-"+strconv.Itoa(k))).Result()
			if err != nil || n > 1 {
				return false, fmt.Sprintf("c-%d: %d entries (%v)", k, n, err)
			}
		}
		return true, ""
	})
}

func TestConsumerStopReleasesForAnImmediateTakeover(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	r.pub.publish("order", "c-1", 3)
	// A lease TTL far longer than the test: only a release lets b in.
	a := r.consumer("host-a", h, time.Hour)
	require.NoError(t, a.Start(context.Background()))
	r.waitApplied(h)
	unit := partition.PartitionUnit("order", "c-1")
	requireCommitted(t, a, unit, 3)
	_, ok := a.Committed("proj", partition.PartitionUnit("order", "c-2"))
	require.False(t, ok, "a unit no worker here runs")
	require.NoError(t, a.Stop(context.Background()))
	_, ok = a.Committed("proj", unit)
	require.False(t, ok, "a stopped instance runs no unit")
	b := r.consumer("host-b", h, time.Hour)
	start(t, b)
	requireCommitted(t, b, unit, 3) // the positions row it claimed
	r.pub.publish("order", "c-1", 3)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	require.Equal(t, int64(2), b.Owned()[0].Generation)
	requireCommitted(t, b, unit, 6)
}

// requireCommitted waits until c's worker of unit (group proj) says it
// has committed up to at (Consumer.Committed, which read-your-writes
// asks), and never past it.
func requireCommitted(t *testing.T, c *redispartition.Consumer, unit string, at int64) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%s committed up to %d", unit, at), func() (bool, string) {
		got, ok := c.Committed("proj", unit)
		require.LessOrEqual(t, got, at, "never past what committed")
		return ok && got == at, fmt.Sprintf("%d (owned: %v)", got, ok)
	})
}

// An owner stalled past its TTL is replaced; when it resumes, its commit
// is refused by the positions fence and its reads and acks by the lease,
// so nothing is applied twice and nothing is reordered.
func TestStalledOwnerIsFencedOutOfRedisAndThePositions(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	stall, stalled, release := stallGate(t)
	ha := newEffects(r.store)
	ha.gate = func(ctx context.Context, _ delivery.Batch) { stall(ctx) }
	hb := newEffects(r.store)
	r.pub.publish("order", "c-1", 4)
	// The TTL is not what the test waits on (deleting the key plays the
	// expiry), so it is long enough that host-b, heartbeating at a fifth
	// of it on a busy machine, keeps the partition: were its lease to
	// lapse, host-a could take the unit back and hb would miss the last
	// two messages.
	const ttl = 2 * time.Second
	a := r.consumer("host-a", ha, ttl)
	start(t, a)
	testwait.Recv(t, "host-a stalls inside its first batch", stalled)
	// The whole instance freezes (a GC pause, a stopped VM): its lease
	// lapses. Deleting the key plays the expiry without waiting for it.
	require.NoError(t, r.rdb.Del(context.Background(), r.prefix+redispartition.LeaseKey("proj", "order:c-1")).Err())
	b := r.consumer("host-b", hb, ttl)
	start(t, b)
	r.waitApplied(hb)
	release() // a resumes with its old generation
	testwait.For(t, "host-a gives the partition up", func() (bool, string) {
		return len(a.Owned()) == 0, fmt.Sprintf("a owns %v", a.Owned())
	})
	got, _ := ha.snapshot()
	require.Empty(t, got, "the stale owner's late commit must be rejected")
	r.pub.publish("order", "c-1", 2)
	r.waitApplied(hb)
	r.requireExactlyOnceInOrder(hb)
}

// A crash between commit and ack leaves the entry pending; the next owner
// reclaims it, recognises it as applied and acks it without handling it.
func TestRedeliveredAfterCommitIsNotAppliedTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	r.pub.publish("order", "c-1", 3)
	// Play the crashed owner by hand: read all three, commit their effects
	// and position, and die before acking.
	l, err := r.leases.Acquire(context.Background(), "proj", "order:c-1", "dead")
	require.NoError(t, err)
	row, err := r.store.Claim(context.Background(), "proj", "order:c-1")
	require.NoError(t, err)
	entries, err := r.leases.Read(context.Background(), l, "order:c-1", false, 10)
	require.NoError(t, err)
	require.Len(t, entries, 3)
	var msgs []delivery.Message
	for _, e := range entries[:2] {
		m, err := redisstream.Decode(e.ID, e.Values)
		require.NoError(t, err)
		msgs = append(msgs, m)
	}
	n, err := h.Handle(context.Background(), delivery.Batch{Group: "proj", Unit: "order:c-1", Source: "order:c-1", Generation: row.Generation, Messages: msgs})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	// The crash: the lease lapses.
	require.NoError(t, r.rdb.Del(context.Background(), r.prefix+redispartition.LeaseKey("proj", "order:c-1")).Err())

	c := r.consumer("host-b", h, time.Hour)
	start(t, c)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, 1, h.calls["m-1"], "an applied message is acked, not handled again")
	require.Equal(t, 1, h.calls["m-3"])
}

func TestPoisonHaltsOnlyItsKeyDurably(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	boom := errors.New("boom")
	h.fail = func(m delivery.Message, _ int) error {
		if m.ID == "m-2" {
			return boom
		}
		return nil
	}
	r.pub.publish("order", "bad", 3) // m-1, m-2 (poison), m-3
	r.pub.publish("order", "good", 3)
	a := r.consumer("host-a", h, time.Hour)
	require.NoError(t, a.Start(context.Background()))
	testwait.For(t, "the bad key halts", func() (bool, string) {
		n, err := r.rdb.Exists(context.Background(), r.prefix+redispartition.HaltKey("proj", "order:bad")).Result()
		return err == nil && n == 1, fmt.Sprintf("halt key exists: %d %v", n, err)
	})
	testwait.For(t, "the good key flows", func() (bool, string) {
		got, _ := h.snapshot()
		return len(got["order:good"]) == 3, fmt.Sprint(got)
	})
	got, _ := h.snapshot()
	require.Equal(t, []int64{1}, got["order:bad"], "only the message before the poison is applied")
	h.mu.Lock()
	require.Equal(t, 3, h.calls["m-2"], "the first attempt and max_retries (2) retries, then halt")
	h.mu.Unlock()
	halt, err := r.rdb.HGetAll(context.Background(), r.prefix+redispartition.HaltKey("proj", "order:bad")).Result()
	require.NoError(t, err)
	require.Contains(t, halt["reason"], "boom")
	require.Equal(t, "3", halt["attempts"])

	// The halt survives a restart of every instance.
	require.NoError(t, a.Stop(context.Background()))
	b := r.consumer("host-b", h, time.Hour)
	start(t, b)
	r.pub.publish("order", "good", 1)
	testwait.For(t, "the good key flows after the restart", func() (bool, string) {
		got, _ := h.snapshot()
		return len(got["order:good"]) == 4, fmt.Sprint(got)
	})
	for _, l := range b.Owned() {
		require.NotEqual(t, "order:bad", l.Unit, "a halted partition is not acquired")
	}
	h.mu.Lock()
	require.Equal(t, 3, h.calls["m-2"], "no attempt after the halt")
	h.mu.Unlock()
}

func TestConsumerOptionsAreChecked(t *testing.T) {
	t.Parallel()
	_, err := redispartition.NewConsumer(redispartition.ConsumerOptions{})
	require.Error(t, err)
}

// Different keys run at once: every batch waits until batches of two
// different partitions are in flight together, which only happens if the
// consumer runs partitions in parallel (a serial consumer would leave the
// first batch waiting until the test gives up).
func TestDifferentKeysRunInParallel(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	var mu sync.Mutex
	inFlight := map[string]bool{}
	together := make(chan struct{})
	met := make(chan struct{}, 1)
	var once sync.Once
	h.gate = func(ctx context.Context, b delivery.Batch) {
		mu.Lock()
		inFlight[b.Unit] = true
		if len(inFlight) >= 2 {
			once.Do(func() { close(together); met <- struct{}{} })
		}
		mu.Unlock()
		select {
		case <-together:
		case <-ctx.Done():
		}
	}
	r.pub.publish("order", "a", 2)
	r.pub.publish("order", "b", 2)
	c := r.consumer("host-a", h, time.Minute)
	start(t, c)
	testwait.Recv(t, "batches of two partitions in flight at once", met)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
}

// partitionFence is the fence of a batch: its unit's generation, advancing
// its source to the batch's last global position.
func partitionFence(b delivery.Batch) position.Fence {
	return position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: b.Messages[len(b.Messages)-1].GlobalPosition}}
}

// stallGate stalls the first batch that passes it (stall reports on
// stalled) until release, or its context ends; release is also called at
// the test's end.
func stallGate(t *testing.T) (stall func(context.Context), stalled <-chan struct{}, release func()) {
	ch := make(chan struct{}, 1)
	gate := make(chan struct{})
	var once, released sync.Once
	release = func() { released.Do(func() { close(gate) }) }
	t.Cleanup(release)
	stall = func(ctx context.Context) {
		once.Do(func() { ch <- struct{}{} })
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return stall, ch, release
}

// An infrastructure failure (a database down, restarting) is retried
// without end and never counted: a key whose commits fail on it for many
// times max_retries does not halt, and its messages are applied in order
// once the database is back. (Before, every handler error counted, and a
// short PostgreSQL restart halted partitions.) A failure of the message's
// own is still counted, and halts the key past its retries.
func TestInfrastructureFailuresNeverHalt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	down := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	h.fail = func(m delivery.Message, calls int) error {
		if m.ID == "m-2" && calls <= 5 {
			return delivery.MarkInfrastructure(down)
		}
		return nil
	}
	r.pub.publish("order", "k", 3)
	a := r.consumer("host-a", h, time.Hour, func(o *redispartition.ConsumerOptions) {
		o.Retry = delivery.Policy{MaxRetries: 1, Delay: time.Millisecond}
	})
	start(t, a)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	n, err := r.rdb.Exists(context.Background(), r.prefix+redispartition.HaltKey("proj", "order:k")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no halt on infrastructure failures")
	h.mu.Lock()
	require.Equal(t, 6, h.calls["m-2"], "retried past max_retries (1), uncounted")
	h.mu.Unlock()
}

// A worker whose Redis goes away keeps its lease and goes on where it was
// as soon as Redis is back: with a lease TTL of an hour, the messages
// published after the cut are handled only if the worker retried in place
// (the old worker ended on the failure and left its lease to lapse, so
// its unit waited out the TTL), and at the generation it started with.
func TestWorkerRetriesServerFailuresInPlace(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	proxy, cut := r.behindProxy()
	h := newEffects(r.store)
	c := r.consumer("host-a", h, time.Hour, func(o *redispartition.ConsumerOptions) {
		o.Leases = redispartition.NewLeases(cut, r.prefix)
		o.Heartbeat = 20 * time.Millisecond
	})
	r.pub.publish("order", "k", 3)
	start(t, c)
	r.waitApplied(h)

	proxy.Cut()
	r.pub.publish("order", "k", 3) // behind the cut: the worker's reads fail
	testwait.For(t, "the worker failing on the cut", func() (bool, string) {
		return proxy.Refused() >= 10, fmt.Sprintf("%d connections refused", proxy.Refused())
	})
	proxy.Resume()
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	gen, err := r.rdb.Get(context.Background(), r.prefix+redispartition.GenerationKey("proj", partition.PartitionUnit("order", "k"))).Int64()
	require.NoError(t, err)
	require.EqualValues(t, 1, gen, "the lease was kept: no new generation")
}

// A message whose prev is past what the worker applied on its stream
// follows messages the stream lost: the worker halts the key there, with
// a reason naming what is missing, rather than apply it past them (before,
// it applied it and the position moved past the lost message for good).
// An operator's resume accepts the gap and the key goes on; a skipped
// poison head is accepted too, so the message after it is no gap.
func TestGapHaltsTheKeyUntilAnOperatorResumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t)
	h := newEffects(r.store)
	h.fail = func(m delivery.Message, _ int) error {
		if m.ID == "m-6" {
			return errors.New("poison")
		}
		return nil
	}
	admin, err := redispartition.NewAdmin(redispartition.AdminOptions{Redis: r.rdb, Prefix: r.prefix, Positions: r.store, Decode: redisstream.Decode})
	require.NoError(t, err)
	r.pub.publish("order", "k", 2)
	// Discovery every 50 ms: a resumed unit is acquired at the next pass.
	start(t, r.consumer("host-a", h, time.Hour, func(o *redispartition.ConsumerOptions) { o.Heartbeat = 50 * time.Millisecond }))
	applied := func(want ...int64) {
		t.Helper()
		testwait.For(t, fmt.Sprintf("order:k applied %v", want), func() (bool, string) {
			got, _ := h.snapshot()
			return slices.Equal(got["order:k"], want), fmt.Sprint(got["order:k"])
		})
	}
	halted := func() map[string]string {
		t.Helper()
		var halt map[string]string
		testwait.For(t, "order:k halts", func() (bool, string) {
			halt, err = r.rdb.HGetAll(ctx, r.prefix+redispartition.HaltKey("proj", "order:k")).Result()
			return err == nil && len(halt) > 0, fmt.Sprint(halt, err)
		})
		return halt
	}

	applied(1, 2)
	require.Equal(t, int64(3), r.pub.lose("order", "k"))
	r.pub.publish("order", "k", 2) // m-4 (prev 3), m-5
	halt := halted()
	require.Contains(t, halt["reason"], "lacks the messages after 2 up to 3")
	require.Equal(t, "m-4", halt["message_id"])
	require.Equal(t, "3", halt["gap"])
	applied(1, 2)

	_, err = admin.Resume(ctx, "proj", "order:k", redispartition.Operator{By: "test", Reason: "message 3 is gone"})
	require.NoError(t, err)
	applied(1, 2, 4, 5)

	r.pub.publish("order", "k", 2) // m-6 (poison), m-7 (prev 6)
	halt = halted()
	require.Contains(t, halt["reason"], "poison")
	require.Contains(t, []string{"", "0"}, halt["gap"], "a poison halt is no gap")
	_, err = admin.Skip(ctx, "proj", "order:k", redispartition.Operator{By: "test", Reason: "poison"})
	require.NoError(t, err)
	applied(1, 2, 4, 5, 7)
}

// A host cut off from Redis past its lease TTL lapses: another takes its
// partition over at the next generation and goes on, and the cut-off host,
// once back, gives the partition up (its heartbeat tells it it lapsed, its
// fenced steps are refused); every message is applied once, in order.
func TestCutOffHostIsTakenOverAndGivesUp(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	proxy, cut := r.behindProxy()
	h := newEffects(r.store) // both hosts' effects: an overlap across them is caught
	const ttl = time.Second
	a := r.consumer("host-a", h, ttl, func(o *redispartition.ConsumerOptions) { o.Leases = redispartition.NewLeases(cut, r.prefix) })
	r.pub.publish("order", "k", 3)
	start(t, a)
	r.waitApplied(h)

	proxy.Cut()
	b := r.consumer("host-b", h, ttl)
	start(t, b)
	r.pub.publish("order", "k", 3)
	r.waitApplied(h)
	require.Len(t, b.Owned(), 1, "host-b took the partition over")
	proxy.Resume()
	testwait.For(t, "host-a gives the partition up", func() (bool, string) {
		return len(a.Owned()) == 0, fmt.Sprintf("a owns %v", a.Owned())
	})
	r.pub.publish("order", "k", 2)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	gen, err := r.rdb.Get(context.Background(), r.prefix+redispartition.GenerationKey("proj", partition.PartitionUnit("order", "k"))).Int64()
	require.NoError(t, err)
	require.EqualValues(t, 2, gen)
}

// behindProxy returns a client of the rig's Redis through a fault proxy
// (no retries of its own), and the proxy that cuts it.
func (r *rig) behindProxy() (*faultproxy.Proxy, *redis.Client) {
	r.t.Helper()
	proxy, err := faultproxy.New(r.rdb.Options().Addr)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = proxy.Close() })
	cut := redis.NewClient(&redis.Options{Addr: proxy.Addr(), DB: r.rdb.Options().DB, MaxRetries: -1})
	r.t.Cleanup(func() { _ = cut.Close() })
	return proxy, cut
}

// Hosts joining under load share the partitions: each holds at most its
// fair share plus one (its group's units over its live consumers, plus
// one) once the others' heartbeats are known, the one that held them all
// hands the excess over at a batch boundary, and nothing is lost, applied
// twice or reordered meanwhile.
func TestJoiningHostsTakeAFairShareUnderLoad(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	const keys, ttl = 30, 5 * time.Second // long enough that no heartbeat lapses on a loaded machine
	key := func(k int) string { return "c-" + strconv.Itoa(k) }
	for k := 0; k < keys; k++ {
		r.pub.publish("order", key(k), 1)
	}
	hosts := []*redispartition.Consumer{r.consumer("host-a", h, ttl)}
	start(t, hosts[0])
	testwait.For(t, "host-a owns every partition", func() (bool, string) {
		return len(hosts[0].Owned()) == keys, fmt.Sprintf("owns %d", len(hosts[0].Owned()))
	})

	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r.pub.publish("order", key(i%keys), 1)
			time.Sleep(time.Millisecond)
		}
	}()
	fair := func(n int) {
		share := keys/n + 1
		testwait.For(t, fmt.Sprintf("%d hosts each own at most %d, all %d together", n, share, keys), func() (bool, string) {
			total, seen := 0, ""
			ok := true
			for _, c := range hosts {
				o := len(c.Owned())
				total += o
				seen += fmt.Sprintf(" %d", o)
				ok = ok && o <= share
			}
			return ok && total == keys, "owned:" + seen
		})
	}
	hosts = append(hosts, r.consumer("host-b", h, ttl))
	start(t, hosts[1])
	fair(2)
	hosts = append(hosts, r.consumer("host-c", h, ttl))
	start(t, hosts[2])
	fair(3)
	close(stop)
	<-stopped
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	// Each partition changed hands at most twice (to the second host, then
	// to the third): a host never takes back what it handed over.
	for k := 0; k < keys; k++ {
		gen, err := r.rdb.Get(context.Background(), r.prefix+redispartition.GenerationKey("proj", partition.PartitionUnit("order", key(k)))).Int64()
		require.NoError(t, err)
		require.LessOrEqual(t, gen, int64(3), "partition %s was acquired %d times", key(k), gen)
	}
}

// A read whose reply is lost and that the client sends again (go-redis
// retries a command after a timeout or a cut connection) delivered
// entries the worker never saw: the second read returns them first, so
// nothing is skipped and no gap is taken for lost messages.
func TestARetriedReadReturnsWhatTheLostReplyDelivered(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	twice := redis.NewClient(&redis.Options{Addr: r.rdb.Options().Addr, DB: r.rdb.Options().DB})
	t.Cleanup(func() { _ = twice.Close() })
	var armed, fired sync.Mutex
	armedOn, firedN := false, 0
	twice.AddHook(readTwice{armed: func() bool {
		armed.Lock()
		defer armed.Unlock()
		return armedOn
	}, fire: func() {
		armed.Lock()
		armedOn = false
		armed.Unlock()
		fired.Lock()
		firedN++
		fired.Unlock()
	}})
	c := r.consumer("host-a", h, 2*time.Second, func(o *redispartition.ConsumerOptions) { o.Leases = redispartition.NewLeases(twice, r.prefix) })
	r.pub.publish("order", "k", 3)
	start(t, c)
	r.waitApplied(h)
	armed.Lock()
	armedOn = true
	armed.Unlock()
	r.pub.publish("order", "k", 20)
	r.waitApplied(h)
	r.requireExactlyOnceInOrder(h)
	fired.Lock()
	require.Equal(t, 1, firedN, "one read was sent twice")
	fired.Unlock()
}

// readTwice is a go-redis hook that, while armed, runs a fenced read of
// new entries ('>') that delivers some a second time and returns only the
// second reply, as a client does after it lost the first.
type readTwice struct {
	armed func() bool
	fire  func()
}

func (readTwice) DialHook(next redis.DialHook) redis.DialHook { return next }

// isNewRead reports a fenced read of new entries: the read script's
// EVALSHA (or EVAL), whose last argument is '>'.
func isNewRead(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 || args[len(args)-1] != ">" {
		return false
	}
	name, _ := args[0].(string)
	return name == "evalsha" || name == "eval"
}

// delivered reports a read that delivered entries (its reply lists ids).
func delivered(cmd redis.Cmder) bool {
	ids, _ := cmd.(*redis.Cmd).StringSlice()
	return len(ids) > 0
}

// ProcessPipelineHook sends a pipeline holding such a read twice (go-redis
// sends a whole pipeline again after a lost reply).
func (h readTwice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		i := slices.IndexFunc(cmds, isNewRead)
		if i < 0 || !h.armed() {
			return next(ctx, cmds)
		}
		if err := next(ctx, cmds); err != nil || !delivered(cmds[i]) {
			return err // nothing delivered: nothing to lose
		}
		h.fire()
		return next(ctx, cmds)
	}
}

func (h readTwice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isNewRead(cmd) || !h.armed() {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil || !delivered(cmd) {
			return err // nothing delivered: nothing to lose
		}
		h.fire()
		return next(ctx, cmd)
	}
}
