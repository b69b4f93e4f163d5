package redispartition

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/lifecycle"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// ConsumerOptions configure a Consumer. Leases, Positions, Handler, Decode
// and Subscriptions are required.
type ConsumerOptions struct {
	Leases    *Leases
	Positions partition.Positions
	Handler   delivery.Handler
	// Decode turns a stream entry back into a message; an entry it fails
	// on is poison (it halts its unit at once).
	Decode func(id string, values map[string]any) (delivery.Message, error)
	// Subscriptions lists the groups to run; it is called on every
	// discovery pass, so a plugin reload takes effect on the next one.
	Subscriptions func() []partition.Subscription
	// Owner identifies this host instance in lease tokens.
	Owner string

	LeaseTTL  time.Duration
	Heartbeat time.Duration // renew and discovery cadence
	Poll      time.Duration // a worker's pause after an empty pass
	ReapIdle  time.Duration // idle time before a worker tries to reap its unit
	// AckDelay is how long a worker may hold the acks of the entries it
	// applied before it sends them: when its unit's next read comes
	// sooner, they ride with it, in the same round trip (a busy key's
	// messages then cost one round trip to Redis each, not two). 0: each
	// run is acked as it commits. A worker sends what it holds before it
	// reaps its unit, halts it or lets it go; a worker that loses its
	// lease (or its process) loses them, and the unit's next owner acks
	// those entries as applied by the positions row, as after a crash
	// between commit and ack.
	AckDelay time.Duration
	// Retry is the retry policy of a message failing on its own: retried
	// Retry.MaxRetries times after its first attempt, then its unit
	// halts; a permanent failure halts at once.
	Retry delivery.Policy
	// Classify says whose failure a handler error is; infrastructure
	// failures are retried without end and never counted towards a halt.
	// Nil is delivery.Classify; engine.Classify is the engine's.
	Classify func(error) delivery.Class
	// Infra counts infrastructure failures (nil: uncounted).
	Infra *delivery.Metrics
	// BatchSize caps a run handed to the handler.
	BatchSize int
	// Lanes enables the backfill lane {stream}:{BackfillSuffix}, drained
	// after the primary stream.
	Lanes          bool
	BackfillSuffix string
	// WarnLivePartitions logs a warning when a category has more live
	// keys; 0 turns it off.
	WarnLivePartitions int

	Metrics *Metrics
	Logger  *slog.Logger
	// Clock is what the pauses between passes, polls and retries wait on
	// (nil: clock.System).
	Clock clock.Clock
}

// Consumer is the partitioned consumer of one host instance: it discovers
// units from the partition indexes, holds leases on as many as it can
// acquire, and runs one worker per owned unit. Start and Stop it once;
// Stop before Start and a second Stop are no-ops.
type Consumer struct {
	opts ConsumerOptions
	log  *slog.Logger

	mu    sync.Mutex
	owned map[unitID]*worker
	// live is the hosts set the last heartbeat read; held the units seen
	// held by other hosts.
	live map[string]bool
	held map[unitID]heldBy
	// ownedBy counts owned units per group (the owned gauge), so a spawn
	// does not walk every owned unit.
	ownedBy map[string]int
	// members counts each group's live consumers (the last heartbeat's),
	// total its units (the last pass's count of the indexes, plus those
	// first seen on a wake-up since, which fresh holds): the fair share. joined are the
	// groups the last heartbeat registered this consumer in.
	members map[string]int
	total   map[string]int
	fresh   map[string]map[string]wokenAt // group → unit → first seen on this wake-up, not yet counted
	// waiting are, per group, the units a placement found free but could
	// not take for this host's share (ErrOverLimit): every later
	// placement with room tries them again (see place).
	waiting map[string]map[string]waitingUnit
	joined  []string
	// rescan asks the next pass to walk the indexes whole (the listener
	// failed or fell behind: wake-ups may be lost). sweeps are the walks,
	// by sweepKey, read and written by discovery only.
	rescan  bool
	sweeps  map[string]*sweep
	placing sync.Mutex // held by place
	// counted is, per group and category, the wake-up stream's last entry
	// at the group's last count (Leases.Count): the keys of the entries up
	// to it are in that count.
	counted map[string]map[string]string
	// ctl is Leases over connections of its own (Leases.Dedicated), for
	// the heartbeat, discovery, acquires and handovers; workers use
	// opts.Leases. Set when discovery starts.
	ctl *Leases

	// life starts discovery and stops it in two phases; soft and work are
	// its contexts, set when discovery starts and read only by discovery
	// and the workers it starts.
	life   lifecycle.Runner
	soft   context.Context // canceled when Stop begins: finish the batch in hand
	work   context.Context // canceled at the hard stop: abandon work in hand
	wg     sync.WaitGroup
	warned map[string]bool
	// outage reports the handler's infrastructure failures once per
	// outage, leaseOutage those of discovery, leases and workers.
	outage, leaseOutage *delivery.Outage
	// core is the delivery algorithm the workers hand their runs to.
	core *delivery.Core
}

type unitID struct{ group, unit string }

// worker is one owned unit.
type worker struct {
	lease Lease
	sub   partition.Subscription
	// key is the partition key or correlation value.
	key string
	mu  sync.Mutex
	// sources are the unit's partition streams (without lanes), in a
	// stable order; a correlated unit gains streams as they appear.
	sources []string
	cat     map[string]string // source -> category

	stop context.CancelFunc
	ctx  context.Context
	done chan struct{}
	// wake is signaled when the unit's streams were published to (or may
	// have been): an idle worker reads them again at once.
	wake chan struct{}
	// claimed is the unit's positions row when the placement that
	// acquired its lease claimed it (with the others it acquired, see
	// wonAll): the worker's start takes it instead of claiming again. The
	// worker's goroutine's only; nil once used.
	claimed *position.Row
	// lost is set when the lease was lost: the worker must not release.
	lost bool
	// handover is set (under the consumer's mu) when the worker was
	// stopped to hand its unit to another host (fair share).
	handover bool
	// committed is the highest position the unit has committed on any of
	// its streams, as far as this worker knows: -1 until it has claimed
	// the positions row, then that row's, then moved by each run it
	// commits (Committed). Written by the worker's goroutine only.
	committed atomic.Int64
	// held counts, per stream, the applied entries whose acks the worker
	// holds (ConsumerOptions.AckDelay): pending in Redis, handled here.
	// The lag metrics leave them out. Under mu.
	held map[string]int
}

// setHeld records how many acks the worker holds on stream.
func (w *worker) setHeld(stream string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n == 0 {
		delete(w.held, stream)
		return
	}
	if w.held == nil {
		w.held = map[string]int{}
	}
	w.held[stream] = n
}

// heldOn is how many acks the worker holds on stream.
func (w *worker) heldOn(stream string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held[stream]
}

// commit records that the unit has committed up to at.
func (w *worker) commit(at int64) {
	if at > w.committed.Load() {
		w.committed.Store(at)
	}
}

// signal wakes the worker if it is idle; a busy one reads again anyway.
func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// NewConsumer returns a consumer; Start runs it.
func NewConsumer(opts ConsumerOptions) (*Consumer, error) {
	switch {
	case opts.Leases == nil, opts.Positions == nil, opts.Handler == nil, opts.Decode == nil, opts.Subscriptions == nil:
		return nil, errors.New("partition: consumer needs Leases, partition.Positions, delivery.Handler, Decode and Subscriptions")
	case opts.Owner == "":
		return nil, errors.New("partition: consumer needs an Owner")
	case opts.LeaseTTL <= 0 || opts.Heartbeat <= 0 || opts.Heartbeat >= opts.LeaseTTL:
		return nil, fmt.Errorf("partition: heartbeat %s must be > 0 and below the lease TTL %s", opts.Heartbeat, opts.LeaseTTL)
	case opts.Poll <= 0:
		return nil, fmt.Errorf("partition: poll interval must be > 0, got %s", opts.Poll)
	case opts.AckDelay < 0:
		return nil, fmt.Errorf("partition: ack delay must be >= 0, got %s", opts.AckDelay)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.BackfillSuffix == "" {
		opts.BackfillSuffix = partition.DefaultBackfillSuffix
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Classify == nil {
		opts.Classify = delivery.Classify
	}
	outage := opts.Infra.Outage("partition workers", opts.Logger, opts.Clock.Now)
	return &Consumer{opts: opts, log: opts.Logger, owned: map[unitID]*worker{}, warned: map[string]bool{}, held: map[unitID]heldBy{}, ownedBy: map[string]int{},
		members: map[string]int{}, total: map[string]int{}, fresh: map[string]map[string]wokenAt{}, waiting: map[string]map[string]waitingUnit{}, sweeps: map[string]*sweep{}, counted: map[string]map[string]string{},
		outage: outage,
		core: &delivery.Core{Policy: opts.Retry, Classify: opts.Classify, Outage: outage, Clock: opts.Clock,
			What: "partition", Log: opts.Logger},
		leaseOutage: opts.Infra.Outage("partition leases", opts.Logger, opts.Clock.Now),
		life:        lifecycle.Runner{Name: "partition consumer", Log: opts.Logger}}, nil
}

// controlConns is the pool of the heartbeat and discovery's connections:
// the heartbeat loop, the listener's acquires and a handover's
// announcement may run at once.
const controlConns = 4

// DefaultBatchSize is the most messages handed to a handler in one call.
const DefaultBatchSize = 64

// Start begins discovery and work. The consumer's goroutines live until
// Stop; ctx's values are kept, its cancellation is not. A consumer starts
// once (lifecycle.Runner).
func (c *Consumer) Start(ctx context.Context) error {
	return c.life.Start(ctx, func(soft, work context.Context) {
		c.soft, c.work = soft, work
		ctl, closeCtl := c.opts.Leases.Dedicated(controlConns)
		c.ctl = ctl
		defer func() { _ = closeCtl() }()
		// The cursors are set before the first discovery pass reads the
		// indexes: a key published after the pass read them wakes the
		// listener, one published before is in them (a publish adds to the
		// index and the wake-up stream in one script).
		cursors := map[string]string{}
		_ = c.follow(soft, cursors) // on failure the listener tries again
		l, listening := c.opts.Leases.Listen(), make(chan struct{})
		go func() {
			defer close(listening)
			c.listen(l, cursors)
		}()
		c.discover(func() { c.stopListening(l, listening) })
		c.wg.Wait()
	})
}

// StopGrace is how long Stop waits, once its deadline has canceled the
// work in hand, for the workers to return.
const StopGrace = lifecycle.Grace

// Stop stops discovery, lets every worker finish the batch in hand, and
// releases every lease so successors take over at once. If ctx ends first,
// work in hand is canceled (its messages stay pending and are redelivered
// to the next owner) and Stop returns ctx's error once every goroutine has
// returned, or StopGrace after the cancel if one has not (a guest call
// that cannot be canceled).
func (c *Consumer) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

// workers lists the running workers.
func (c *Consumer) workers() []*worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := make([]*worker, 0, len(c.owned))
	for _, w := range c.owned {
		ws = append(ws, w)
	}
	return ws
}

// Committed implements partition.LocalUnits: how far group's unit has
// committed, when a worker of this instance runs it and has claimed its
// positions row. It is what the worker knows: never past the row, behind
// it only if the unit was lost to another instance meanwhile.
func (c *Consumer) Committed(group, unit string) (int64, bool) {
	c.mu.Lock()
	w := c.owned[unitID{group, unit}]
	c.mu.Unlock()
	if w == nil {
		return 0, false
	}
	at := w.committed.Load()
	return at, at >= 0
}

// Owned lists the units this instance holds, for status and tests.
func (c *Consumer) Owned() []Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Lease, 0, len(c.owned))
	for _, w := range c.owned {
		out = append(out, w.lease)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Group != out[j].Group {
			return out[i].Group < out[j].Group
		}
		return out[i].Unit < out[j].Unit
	})
	return out
}

// discover is the heartbeat loop: renew, discover, acquire. When the
// consumer stops, it calls stopListening (no worker starts after it
// returns), then stops the workers.
func (c *Consumer) discover(stopListening func()) {
	failures := 0
	for {
		err := c.pass()
		wait := c.opts.Heartbeat
		if err != nil {
			// Try again soon, never slower than the heartbeat: the leases
			// held here are renewed by this loop, and must be renewed as
			// soon as the servers are back.
			failures++
			wait = min(c.opts.Retry.InfraPause(failures), c.opts.Heartbeat)
			c.leaseOutage.Fail(fmt.Errorf("discovery: %w", err), "failures", failures)
		} else {
			failures = 0
			c.leaseOutage.OK()
		}
		select {
		case <-c.soft.Done():
			stopListening()
			c.shutdownWorkers()
			// Every lease is released: leaving the hosts set now tells the
			// others at their next pass (a stop's successors need no lapse).
			lctx, cancel := context.WithTimeout(context.WithoutCancel(c.work), min(c.opts.LeaseTTL, 2*time.Second))
			if err := c.ctl.Leave(lctx, c.opts.Owner, c.joined); err != nil {
				c.log.Warn("partition consumer: leaving the hosts set failed; it lapses by itself", "error", err)
			}
			cancel()
			return
		case <-c.opts.Clock.After(wait):
		}
	}
}

// shutdownWorkers stops every worker and waits; each releases its lease.
func (c *Consumer) shutdownWorkers() {
	ws := c.workers()
	for _, w := range ws {
		w.stop()
	}
	for _, w := range ws {
		<-w.done
	}
}

// pass is one heartbeat: register as live (and as a consumer of each
// subscribed group), stop the workers whose leases were taken over if the
// heartbeat had lapsed, then, for each subscription, count its units, walk
// the next page of its indexes (sweep), try to acquire the units found
// there that are not held here up to this host's fair share, and hand
// over what it holds beyond that share.
func (c *Consumer) pass() error {
	ctx := c.soft
	subs := c.opts.Subscriptions()
	wanted := map[string]partition.Subscription{}
	groups := make([]string, 0, len(subs))
	for _, s := range subs {
		if _, ok := wanted[s.Group]; !ok {
			groups = append(groups, s.Group)
		}
		wanted[s.Group] = s
	}
	c.stopUnwanted(wanted)
	var left []string
	for _, g := range c.joined {
		if _, ok := wanted[g]; !ok {
			left = append(left, g)
		}
	}
	beat, err := c.ctl.Heartbeat(ctx, c.opts.Owner, c.opts.LeaseTTL, groups, left)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	c.mu.Lock()
	// A host that left or lapsed, or a group that lost a consumer, leaves
	// units to take over or acquire that no wake-up names: walk every
	// index whole this pass instead of a page of it.
	full := c.rescan
	for o := range c.live {
		full = full || !beat.Live[o]
	}
	for g, n := range c.members {
		full = full || beat.Members[g] < n
	}
	c.rescan = false
	c.live, c.members, c.joined = beat.Live, beat.Members, groups
	for g := range c.waiting {
		if _, ok := wanted[g]; !ok {
			delete(c.waiting, g) // unsubscribed
		}
	}
	c.mu.Unlock()
	if beat.Lapsed {
		if held := c.workers(); len(held) > 0 {
			c.check(ctx, held)
		}
	}
	var errs []error
	walked := map[string]bool{}
	for _, s := range subs {
		key := sweepKey(s)
		walked[key] = true
		if err := c.sweep(ctx, s, key, full); err != nil {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	for key := range c.sweeps {
		if !walked[key] {
			delete(c.sweeps, key) // unsubscribed
		}
	}
	return errors.Join(errs...)
}

// stopUnwanted stops the workers of groups no longer subscribed (the
// handler is gone): each releases its lease. The owned units are walked
// only when one of their groups is gone: a pass over 100,000 of them
// cost more than the rest of an idle pass.
func (c *Consumer) stopUnwanted(wanted map[string]partition.Subscription) {
	c.mu.Lock()
	gone := false
	for g, n := range c.ownedBy {
		if _, ok := wanted[g]; n > 0 && !ok {
			gone = true
		}
	}
	var out []*worker
	if gone {
		for _, w := range c.owned {
			if _, ok := wanted[w.sub.Group]; !ok {
				out = append(out, w)
			}
		}
	}
	c.mu.Unlock()
	for _, w := range out {
		w.stop()
	}
}

// Discovery walks each subscription's category indexes with a cursor
// (SSCAN), a page per pass, instead of reading them whole every pass: at
// 100,000 keys the whole read, with the units built from it and placed,
// cost a host half a core while idle. A page holds at least sweepPage keys
// and at least the indexes' keys over sweepPasses, so a walk covers every
// key that stays in the index within sweepPasses passes (one pass up to
// sweepPage keys): a unit no wake-up named (a listener that failed, a
// release whose announcement was lost, a halt resumed) is found within
// that many heartbeats. The group's unit count for the fair share is SCARD
// (O(1)), not the walk's. A pass walks the indexes whole when the walk is
// new (a host starting, a subscription added), when a host left or lapsed
// or a group lost a consumer (their units are to be taken over at once),
// and after the listener failed or fell behind.
const (
	sweepPage   = 1000
	sweepPasses = 20
)

// scanCount is SSCAN's COUNT: keys per round trip.
const scanCount = 1000

// sweep is a subscription's walk over its categories' indexes.
type sweep struct {
	cat    int    // the category walked (an index into Categories)
	cursor uint64 // its SSCAN cursor
	halted int    // halted units met so far in this walk
	// seen are the units met so far in this walk, and units their count
	// in the last whole walk (-1 before one): a correlated subscription's
	// unit count, which the indexes' sizes overstate (a value in two
	// categories is one unit).
	seen  map[string]bool
	units int
	// keys is the indexes' size at the last count: the next page's size.
	keys int
}

// sweepKey names a subscription's walk: a reload that changes its
// categories starts a new one.
func sweepKey(s partition.Subscription) string {
	return fmt.Sprintf("%s\x00%t\x00%q", s.Group, s.Correlated, s.Categories)
}

// sweep is one pass of discovery over subscription s: walk the next page
// of its indexes (all of them when full), count its units (SCARD),
// acquire the units found free there and take over those of lapsed hosts,
// up to the fair share, and hand over what this host holds beyond it.
func (c *Consumer) sweep(ctx context.Context, s partition.Subscription, key string, full bool) error {
	sw := c.sweeps[key]
	if sw == nil {
		sw = &sweep{units: -1}
		c.sweeps[key] = sw
		full = true
	}
	if full {
		*sw = sweep{units: sw.units, keys: sw.keys}
	}
	// The walk comes before the count, so that the count includes every
	// unit the walk found: woken takes a unit it finds owned or held here
	// for counted already, so a unit published after a count made before
	// the walk, then found by the walk and taken or found held by this
	// pass, was counted by neither, and the group undercounted until the
	// next pass.
	before := *sw
	// The pages are placed together: a worker starts on each unit won,
	// and the first steps of a thousand of them delay every scan after
	// them by far more than the scans take.
	found, done, werr := c.walk(ctx, s, sw, full, max(sweepPage, (sw.keys+sweepPasses-1)/sweepPasses))
	counts, at, err := c.ctl.Count(ctx, s.Categories)
	if err != nil {
		*sw = before // the next pass walks this page again
		return err   // nothing placed or shed on a count unknown
	}
	keys := 0
	for i, n := range counts {
		keys += n
		if cat, warn := s.Categories[i], c.opts.WarnLivePartitions; warn > 0 && n > warn && !c.warned[cat] {
			c.warned[cat] = true
			c.log.Warn("many live partitions: sequential_by is meant for bounded key sets", "category", cat, "live_partitions", n, "warn_live_partitions", warn)
		}
	}
	total := keys
	if s.Correlated && sw.units >= 0 {
		total = sw.units
	}
	tails := make(map[string]string, len(at))
	for i, cat := range s.Categories {
		tails[cat] = at[i]
	}
	c.mu.Lock()
	c.counted[s.Group] = tails
	total += c.settleFreshLocked(s.Group, tails)
	c.total[s.Group] = total
	c.mu.Unlock()
	sw.keys = keys
	n, err := c.place(ctx, s, found, total, false, true)
	if sw.halted += n; done && err == nil {
		c.opts.Metrics.setHalted(s.Group, sw.halted) // a whole walk's count
		sw.halted = 0
	}
	if err = errors.Join(werr, err); err != nil {
		return err
	}
	c.shed(s.Group, total)
	return nil
}

// walk reads s's indexes on from sw's cursor, budget keys or (full) up to
// the end of the walk: the units found, and whether the walk ended.
func (c *Consumer) walk(ctx context.Context, s partition.Subscription, sw *sweep, full bool, budget int) (found []unit, done bool, _ error) {
	for read := 0; full || read < budget; {
		cat := s.Categories[sw.cat]
		ks, next, err := c.ctl.Scan(ctx, cat, sw.cursor, scanCount)
		if err != nil {
			return found, false, err // the walk goes on from the same cursor next pass
		}
		read += len(ks)
		if len(ks) > 0 {
			units, err := c.pageUnits(ctx, s, cat, ks)
			if err != nil {
				return found, false, err
			}
			if s.Correlated {
				if sw.seen == nil {
					sw.seen = map[string]bool{}
				}
				for _, u := range units {
					sw.seen[u.unit] = true
				}
			}
			found = append(found, units...)
		}
		sw.cursor = next
		if next != 0 {
			continue
		}
		if sw.cat++; sw.cat < len(s.Categories) {
			continue
		}
		sw.cat, sw.units, sw.seen = 0, len(sw.seen), nil
		return found, true, nil
	}
	return found, false, nil
}

// pageUnits builds the units of a page of keys of category cat. A
// correlated unit's other sources are looked up in the other categories'
// indexes (SMISMEMBER), so that its worker starts on all of them.
func (c *Consumer) pageUnits(ctx context.Context, s partition.Subscription, cat string, ks []string) ([]unit, error) {
	keys := map[string][]string{cat: ks}
	if s.Correlated {
		for _, other := range s.Categories {
			if other == cat {
				continue
			}
			in, err := c.ctl.Holding(ctx, other, ks)
			if err != nil {
				return nil, err
			}
			for i, ok := range in {
				if ok {
					keys[other] = append(keys[other], ks[i])
				}
			}
		}
	}
	return buildUnits(s, keys), nil
}

// wokenAt is the wake-up entry a unit was first seen on: the category's
// wake-up stream and the entry's id.
type wokenAt struct{ cat, id string }

// settleFreshLocked settles the units of group first seen on wake-ups
// into a count of its units (Leases.Count): a unit whose wake-up entry is
// at or before the count's tail of that stream is in the index it counted
// and is forgotten; a later one is not in it, and is added (until a count
// includes it). Dropping those undercounted the group, and a new key could
// then find no host with room. One this count cannot place (its category
// no longer subscribed) is forgotten too. c.mu is held.
func (c *Consumer) settleFreshLocked(group string, tails map[string]string) int {
	n := 0
	for u, w := range c.fresh[group] {
		if tail, ok := tails[w.cat]; !ok || w.id == "" || !idAfter(w.id, tail) {
			delete(c.fresh[group], u)
			continue
		}
		n++
	}
	return n
}

// shareLocked is the most units of group (of total) this consumer holds:
// all of them while it is the group's only live consumer, else their
// count over the consumers', plus one. The shares of all the group's
// consumers then add up to more than its units, so every unit has room
// somewhere. -1: no limit. c.mu is held.
func (c *Consumer) shareLocked(group string, total int) int {
	h := c.members[group]
	if h <= 1 {
		return -1
	}
	return total/h + 1
}

// shed hands over the units of group this consumer holds beyond its fair
// share: each such worker stops at its batch boundary and releases its
// lease, and once they have, one wake-up entry per category names the
// released keys, so the consumers with room acquire them at once (a
// successor that missed it finds them within a walk of the index, see sweep). It picks the
// units to hand over in an order of their own per host (a hash of the
// owner and the unit), so that hosts do not pass the same units back and
// forth.
func (c *Consumer) shed(group string, total int) {
	c.mu.Lock()
	// The count may have grown since the pass read it (units first seen
	// on wake-ups meanwhile, see woken): a share of the older count hands
	// over units that no host then has room for until its next pass.
	total = max(total, c.total[group])
	share := c.shareLocked(group, total)
	if share < 0 || c.ownedBy[group] <= share {
		c.mu.Unlock()
		return
	}
	var mine []*worker
	for _, w := range c.owned {
		if w.lease.Group == group && !w.handover {
			mine = append(mine, w)
		}
	}
	excess := len(mine) - share
	if excess <= 0 {
		c.mu.Unlock()
		return
	}
	rank := func(w *worker) uint64 { return fnv64(c.opts.Owner + "\x00" + w.lease.Unit) }
	slices.SortFunc(mine, func(a, b *worker) int { return cmp.Compare(rank(b), rank(a)) })
	out := mine[:excess]
	for _, w := range out {
		w.handover = true
	}
	c.mu.Unlock()
	c.log.Info("partitions handed over for a fair share", "group", group, "count", excess, "share", share, "units", total)
	c.opts.Metrics.handedOver(group, excess)
	for _, w := range out {
		w.stop()
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		released := map[string][]string{}
		for _, w := range out {
			<-w.done
			w.mu.Lock()
			if !w.lost {
				for _, src := range w.sources {
					released[w.cat[src]] = append(released[w.cat[src]], w.key)
				}
			}
			w.mu.Unlock()
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.work), c.opts.LeaseTTL)
		defer cancel()
		for cat, keys := range released {
			if err := c.ctl.Released(ctx, cat, keys); err != nil {
				c.log.Warn("partition handover: announcing the released keys failed; successors find them within a walk of the index", "category", cat, "error", err)
			}
		}
	}()
}

func fnv64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// check stops the workers whose leases were taken over while this
// consumer's heartbeat had lapsed (Leases.CheckAll). Without it they
// would learn so at their next fenced step; this frees them at once.
func (c *Consumer) check(ctx context.Context, ws []*worker) {
	leases := make([]Lease, len(ws))
	for i, w := range ws {
		leases[i] = w.lease
	}
	lost, err := c.ctl.CheckAll(ctx, leases)
	for _, i := range lost {
		c.lose(ws[i], fmt.Errorf("partition %s %s: taken over at generation %d while the heartbeat had lapsed: %w",
			leases[i].Group, leases[i].Unit, leases[i].Generation, ErrLeaseLost))
	}
	if err != nil && ctx.Err() == nil {
		c.leaseOutage.Fail(fmt.Errorf("lease check: %w", err), "leases", len(ws))
	}
}

// heldBy is a unit another live host was seen holding: it is not tried
// again until its holder's heartbeat lapses, or until (a lease TTL after
// it was seen) the entry is stale, so a unit its holder released is
// picked up here within a TTL even if no publish wakes it.
type heldBy struct {
	owner string
	until time.Time
}

// place gives each unit of s to its worker here (adding the streams a
// correlated unit gained, and waking the worker when wake is set), and
// tries to acquire the others that no live host was seen holding, in one
// call per chunk (Leases.AcquireAll), up to this host's fair share of the
// group's total units, starting a worker on each it gets. On a discovery
// pass (takeover set) it then takes over, within the same share, the
// units whose holder's heartbeat has lapsed, judged by a hosts set read
// after the holder's token. It returns how many units it found halted.
//
// A unit found free but over the share is remembered (c.waiting), and
// every later placement of its group with room (a wake-up's, a pass's)
// tries it again, before its own units (the other hosts try a woken key
// too): the room a new key's wake-up makes
// (the count, and so the share, grows) may be on a host that passed the
// unit by, and nothing else names it before that host's discovery walk
// comes round to it again, up to sweepPasses heartbeats later. Hosts
// that start together each found the keys published before their
// listeners began while at their share, and with discovery an hour apart
// such a key waited an hour.
//
// It logs one INFO line for the group when it started workers ("partitions
// running", with how many this host now runs): a start-up with 100,000 keys
// is one line per group, not lines per partition (those are DEBUG).
func (c *Consumer) place(ctx context.Context, s partition.Subscription, units []unit, total int, wake, takeover bool) (halted int, _ error) {
	// One placement at a time (discovery's, the listener's): each takes
	// up to the share less what is owned, and two at once both counted
	// room that only one of them had.
	c.placing.Lock()
	defer c.placing.Unlock()
	var started, takenOver int
	defer func() {
		if started == 0 {
			return
		}
		c.mu.Lock()
		running := c.ownedBy[s.Group]
		c.mu.Unlock()
		c.log.Info("partitions running", "group", s.Group, "units", running, "started", started, "taken_over", takenOver, "total", total)
	}()
	var free []unit
	now := c.opts.Clock.Now()
	c.mu.Lock()
	for _, u := range units {
		id := unitID{s.Group, u.unit}
		if w := c.owned[id]; w != nil {
			w.merge(u.sources, u.cat)
			if wake {
				w.signal()
			}
			continue
		}
		if h, ok := c.held[id]; ok && c.live[h.owner] && now.Before(h.until) {
			continue
		}
		free = append(free, u)
	}
	// The count may have grown since the caller read it (a wake-up read
	// while a pass walked): take the share of the larger.
	limit := c.shareLocked(s.Group, max(total, c.total[s.Group]))
	if limit >= 0 {
		limit = max(limit-c.ownedBy[s.Group], 0)
	}
	if waiting := c.waiting[s.Group]; limit != 0 && len(waiting) > 0 {
		named := make(map[string]bool, len(units))
		for _, u := range units {
			named[u.unit] = true
		}
		var again []unit
		for name, wu := range waiting {
			id := unitID{s.Group, name}
			if h, ok := c.held[id]; c.owned[id] != nil || !now.Before(wu.until) || ok && c.live[h.owner] && now.Before(h.until) {
				delete(waiting, name)
				continue
			}
			if !named[name] {
				again = append(again, wu.unit)
			}
		}
		slices.SortFunc(again, func(a, b unit) int { return cmp.Compare(a.unit, b.unit) })
		free = append(again, free...)
	}
	c.mu.Unlock()
	if len(free) == 0 {
		return 0, nil
	}
	want := make([]Want, len(free))
	for i, u := range free {
		want[i] = Want{Unit: Unit{s.Group, u.unit}}
	}
	got, err := c.ctl.AcquireAll(ctx, want, c.opts.Owner, limit)
	c.mu.Lock()
	for i, a := range got {
		u := free[i]
		if errors.Is(a.Err, ErrOverLimit) {
			if c.waiting[s.Group] == nil {
				c.waiting[s.Group] = map[string]waitingUnit{}
			}
			c.waiting[s.Group][u.unit] = waitingUnit{u, now.Add(c.opts.ReapIdle)}
		} else {
			delete(c.waiting[s.Group], u.unit) // taken here, held or halted
		}
	}
	c.mu.Unlock()
	var lapsed []int // indexes into free and want
	var wonLeases []Lease
	var wonUnits []unit
	for i, a := range got {
		switch {
		case errors.Is(a.Err, ErrHalted):
			halted++
		case errors.Is(a.Err, ErrLeaseHeld):
			owner, _, _ := parseToken(a.Holder)
			c.mu.Lock()
			c.held[unitID{s.Group, free[i].unit}] = heldBy{owner: owner, until: now.Add(c.opts.LeaseTTL)}
			alive := c.live[owner]
			c.mu.Unlock()
			if !alive {
				want[i].Lapsed = a.Holder
				lapsed = append(lapsed, i)
			}
		case a.Err == nil:
			wonLeases, wonUnits = append(wonLeases, a.Lease), append(wonUnits, free[i])
			if limit > 0 {
				limit--
			}
		}
	}
	started += c.wonAll(ctx, s, wonLeases, wonUnits)
	if err != nil || !takeover || len(lapsed) == 0 || limit == 0 {
		return halted, err
	}
	live, err := c.ctl.Live(ctx)
	if err != nil {
		return halted, err
	}
	var again []Want
	var units2 []unit
	for _, i := range lapsed {
		if owner, _, _ := parseToken(want[i].Lapsed); !live[owner] {
			again = append(again, want[i])
			units2 = append(units2, free[i])
		}
	}
	got, err = c.ctl.AcquireAll(ctx, again, c.opts.Owner, limit)
	wonLeases, wonUnits = wonLeases[:0], wonUnits[:0]
	for i, a := range got {
		if a.Err == nil {
			c.log.Debug("partition taken over from a lapsed host", "group", s.Group, "partition", a.Lease.Unit, "from", again[i].Lapsed)
			wonLeases, wonUnits = append(wonLeases, a.Lease), append(wonUnits, units2[i])
		}
	}
	n := c.wonAll(ctx, s, wonLeases, wonUnits)
	started += n
	takenOver += n
	return halted, err
}

// waitingUnit is a unit a placement found free and over the share (see
// place), tried again until a reap time after that: a unit acquired
// elsewhere since is reaped no sooner, so a key reaped meanwhile is never
// acquired again from here.
type waitingUnit struct {
	unit
	until time.Time
}

// wonAll starts the workers of units whose leases this consumer acquired
// (leases[i] is units[i]'s), and returns how many it started (none for a
// unit whose worker runs here already). It claims their positions rows in
// one call (Positions.ClaimAll) before it starts them, so that a start or
// a takeover of thousands of units does not queue thousands of claims, a
// round trip each, for the database's pool, ahead of the commands that
// need it; each worker then starts from its row. Should the claim fail,
// each worker claims its own as it starts, and retries as ever.
func (c *Consumer) wonAll(ctx context.Context, s partition.Subscription, leases []Lease, units []unit) int {
	var names []string
	var todo []int
	c.mu.Lock()
	for i, u := range units {
		id := unitID{s.Group, u.unit}
		delete(c.held, id)
		if c.owned[id] == nil {
			names = append(names, u.unit)
			todo = append(todo, i)
		}
	}
	c.mu.Unlock()
	// One unit (a new key's wake-up, the usual case) is claimed by its
	// worker, off the placement's path, as before.
	var rows []position.Row
	if len(todo) > 1 {
		var err error
		if rows, err = c.opts.Positions.ClaimAll(ctx, s.Group, names); err != nil {
			c.log.Debug("partition positions claimed one by one: the claim of all failed", "group", s.Group, "units", len(names), "error", err)
			rows = nil // whatever a failed claim returned
		}
	}
	started := 0
	for j, i := range todo {
		var claimed *position.Row
		if rows != nil {
			claimed = &rows[j]
		}
		if c.spawn(leases[i], s, units[i], claimed) {
			c.opts.Metrics.acquired(s.Group)
			started++
		}
	}
	return started
}

// unit is a discovered unit: its name, key and source streams.
type unit struct {
	unit    string
	key     string
	sources []string
	cat     map[string]string // source stream -> its category
	// label names the unit's category for operators: the category, or a
	// correlated process manager's name.
	label string
}

// buildUnits groups a subscription's live keys, per category as its index
// lists them, into units in a stable order: each key of each category is a
// unit of its own, or, for a correlated subscription, one unit per value
// spanning every category that has it.
func buildUnits(s partition.Subscription, keys map[string][]string) []unit {
	byName := map[string]*unit{}
	var order []string
	for _, cat := range s.Categories {
		ks := append([]string(nil), keys[cat]...)
		sort.Strings(ks)
		for _, k := range ks {
			name, label := partition.UnitOf(s.Group, cat, k, s.Correlated), cat
			if s.Correlated {
				label = s.Group
			}
			u := byName[name]
			if u == nil {
				u = &unit{unit: name, key: k, cat: map[string]string{}, label: label}
				byName[name] = u
				order = append(order, name)
			}
			st := partition.StreamName(cat, k)
			u.sources = append(u.sources, st)
			u.cat[st] = cat
		}
	}
	out := make([]unit, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	return out
}

func (w *worker) merge(sources []string, cat map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range sources {
		if _, ok := w.cat[s]; !ok {
			w.sources = append(w.sources, s)
			w.cat[s] = cat[s]
		}
	}
}

func (w *worker) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.sources...)
}

// spawn starts the worker of a freshly acquired unit, unless one runs
// here already (a discovery pass and a wake-up that acquired it at once:
// Leases.AcquireAll answers the caller's own lease again).
func (c *Consumer) spawn(lease Lease, s partition.Subscription, u unit, claimed *position.Row) bool {
	ctx, stop := context.WithCancel(c.soft)
	w := &worker{lease: lease, sub: s, key: u.key, sources: u.sources, cat: u.cat, stop: stop, ctx: ctx, done: make(chan struct{}),
		wake: make(chan struct{}, 1), claimed: claimed}
	w.committed.Store(-1)
	c.mu.Lock()
	if c.owned[unitID{lease.Group, lease.Unit}] != nil {
		c.mu.Unlock()
		stop()
		return false
	}
	c.owned[unitID{lease.Group, lease.Unit}] = w
	c.ownedBy[lease.Group]++
	n := c.ownedBy[lease.Group]
	c.mu.Unlock()
	c.opts.Metrics.setOwned(s.Group, n)
	c.log.Debug("partition acquired", "group", lease.Group, "partition", lease.Unit, "generation", lease.Generation)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(w.done)
		c.run(w)
		c.mu.Lock()
		delete(c.owned, unitID{lease.Group, lease.Unit})
		c.ownedBy[lease.Group]--
		n := c.ownedBy[lease.Group]
		c.mu.Unlock()
		c.opts.Metrics.setOwned(s.Group, n)
	}()
	return true
}

// lose marks a worker's lease lost and stops it without a release.
func (c *Consumer) lose(w *worker, err error) {
	w.mu.Lock()
	first := !w.lost
	w.lost = true
	w.mu.Unlock()
	if first {
		c.opts.Metrics.lost(w.lease.Group)
		c.log.Warn("partition lease lost", "group", w.lease.Group, "partition", w.lease.Unit, "generation", w.lease.Generation, "error", err)
	}
	w.stop()
}

// run is one owned unit's worker: claim the positions row, reclaim the
// previous owner's pending entries, then drain until stopped, the lease is
// lost, the unit halts or it is reaped.
func (c *Consumer) run(w *worker) {
	release := true
	var st *state
	defer func() {
		w.mu.Lock()
		lost := w.lost
		w.mu.Unlock()
		if release && !lost {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(c.work), min(c.opts.LeaseTTL, 2*time.Second))
			if st != nil {
				// What it applied goes acked to the next owner, which
				// would otherwise read it again to ack it.
				if err := c.flush(rctx, w, st); err != nil && !errors.Is(err, ErrLeaseLost) {
					c.log.Warn("partition acks at release failed", "group", w.lease.Group, "partition", w.lease.Unit, "error", err)
				}
			}
			if err := c.opts.Leases.Release(rctx, w.lease); err != nil && !errors.Is(err, ErrLeaseLost) {
				c.log.Warn("partition lease release failed", "group", w.lease.Group, "partition", w.lease.Unit, "error", err)
			}
			cancel()
		}
	}()
	failures := 0
	for st == nil {
		var err error
		if st, err = c.start(w); err != nil {
			if failures++; !c.retry(w, err, failures) {
				return
			}
		}
	}
	idleSince := c.opts.Clock.Now()
	for {
		if w.ctx.Err() != nil {
			return
		}
		n, more, err := c.drainAll(w, st)
		if err != nil {
			if errors.Is(err, errHalted) {
				release = false // the halt released the lease
				return
			}
			if failures++; !c.retry(w, err, failures) {
				return
			}
			// Read own pending entries again: a run committed and not
			// acked is there, and is acked as applied.
			clear(st.drained)
			clear(st.first)
			continue
		}
		if failures > 0 {
			failures = 0
			c.leaseOutage.OK()
		}
		if n > 0 {
			idleSince = c.opts.Clock.Now()
		}
		if more {
			continue
		}
		if c.opts.Clock.Now().Sub(idleSince) >= c.opts.ReapIdle {
			reaped, err := c.reap(w, st)
			if err != nil {
				if failures++; !c.retry(w, err, failures) {
					return
				}
				continue
			}
			if reaped {
				c.log.Info("partition reaped", "group", w.lease.Group, "partition", w.lease.Unit)
				return
			}
			idleSince = c.opts.Clock.Now()
		}
		if st.pendingLeft() {
			continue
		}
		if !c.wait(w, st, idleSince) {
			return
		}
	}
}

// wait waits, idle, for a wake-up or the safety net's re-read, sending
// the acks the worker holds when they have waited AckDelay for a read to
// ride with. It reports false when the worker is to stop.
func (c *Consumer) wait(w *worker, st *state, idleSince time.Time) bool {
	for {
		var flushAt <-chan time.Time
		if len(st.held) > 0 {
			flushAt = c.opts.Clock.After(max(0, c.opts.AckDelay-c.opts.Clock.Now().Sub(st.heldSince)))
		}
		select {
		case <-w.ctx.Done():
			return false
		case <-w.wake:
		case <-flushAt:
			if err := c.flush(c.work, w, st); err != nil {
				// The next read carries them again.
				c.log.Debug("partition acks failed; they go with the next read", "group", w.lease.Group, "partition", w.lease.Unit, "error", err)
				return true
			}
			continue
		case <-c.opts.Clock.After(c.idleWait(idleSince)):
			// Quiet since the last wait: trim what was acked since the
			// last trim. Not at the end of every burst: a stream that gets
			// a message now and then would trim after each, and a burst
			// would pay for its trim before the next unit's read.
			for stream := range st.untrimmed {
				c.acked(w, st, stream, 0, true)
			}
		}
		return true
	}
}

// idleRechecks is about how many idle partitions a consumer reads again
// per second without a wake-up: the safety net's whole cost, however many
// partitions it holds.
const idleRechecks = 200

// idleWait is how long an idle worker waits for a wake-up before it reads
// its streams again anyway: Poll, or longer when so many units are held
// that Poll would read more than idleRechecks of them per second, spread
// by a random quarter so that workers started together do not read
// together; never past the unit's reap time.
func (c *Consumer) idleWait(idleSince time.Time) time.Duration {
	c.mu.Lock()
	n := len(c.owned)
	c.mu.Unlock()
	wait := max(c.opts.Poll, time.Duration(n)*time.Second/idleRechecks)
	wait += rand.N(wait/4 + 1)
	if reap := c.opts.ReapIdle - c.opts.Clock.Now().Sub(idleSince); reap < wait {
		wait = max(reap, 0)
	}
	return wait
}

// retry decides what a worker does after its servers failed it (the
// failures-th time in a row): a lost lease or fence stops it without a
// release; a stop ends it; anything else (Redis or PostgreSQL unreachable,
// restarting, stalled) is retried in place after the infrastructure pause,
// keeping the lease, so the unit goes on as soon as the servers are back
// instead of a lease TTL later. Every step the worker retries is fenced by
// its lease token in Redis and its generation in the positions table, and
// the heartbeat stops it once the lease is lost.
func (c *Consumer) retry(w *worker, err error, failures int) bool {
	if w.ctx.Err() != nil {
		return false
	}
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, position.ErrFenced) {
		c.lose(w, err)
		return false
	}
	// One line per outage, not one per partition.
	c.leaseOutage.Fail(fmt.Errorf("partition worker: %w", err), "group", w.lease.Group, "partition", w.lease.Unit, "failures", failures)
	select {
	case <-w.ctx.Done():
		return false
	case <-c.opts.Clock.After(c.opts.Retry.InfraPause(failures)):
		return true
	}
}

// state is a worker's view of its unit after the claim.
type state struct {
	generation int64
	positions  map[string]int64
	// drained marks a source whose pending entries list this owner has
	// emptied, so reads go straight to new entries.
	drained map[string]bool
	// untrimmed counts the entries acked per stream since its last trim.
	untrimmed map[string]int
	// first holds the first read of each stream, made by Leases.Take with
	// the reclaim; drain hands it out instead of reading.
	first map[string][]Entry
	// after is the last entry delivered on each stream: the next read of
	// new entries begins past it (Leases.ReadAfter's guess).
	after map[string]string
	// held are the acks the worker holds, per stream, since heldSince
	// (ConsumerOptions.AckDelay).
	held      map[string][]string
	heldSince time.Time
}

// ack acks ids of stream, applied: at once when AckDelay is 0, else
// they are held for the next read (or the flush AckDelay after the
// first held one).
func (c *Consumer) ack(ctx context.Context, w *worker, st *state, stream string, ids []string) error {
	if c.opts.AckDelay <= 0 {
		if _, err := c.opts.Leases.Ack(ctx, w.lease, stream, ids...); err != nil {
			return err
		}
		c.acked(w, st, stream, len(ids), false)
		return nil
	}
	if len(st.held) == 0 {
		st.heldSince = c.opts.Clock.Now()
	}
	st.held[stream] = append(st.held[stream], ids...)
	w.setHeld(stream, len(st.held[stream]))
	return nil
}

// heldAcks lists the acks st holds, by stream in name order.
func (st *state) heldAcks() []Acks {
	if len(st.held) == 0 {
		return nil
	}
	out := make([]Acks, 0, len(st.held))
	for _, stream := range slices.Sorted(maps.Keys(st.held)) {
		out = append(out, Acks{Stream: stream, IDs: st.held[stream]})
	}
	return out
}

// sent records that the acks st held reached Redis.
func (c *Consumer) sent(w *worker, st *state, acks []Acks) {
	for _, a := range acks {
		delete(st.held, a.Stream)
		w.setHeld(a.Stream, 0)
		c.acked(w, st, a.Stream, len(a.IDs), false)
	}
}

// flush sends the acks st holds, in one round trip.
func (c *Consumer) flush(ctx context.Context, w *worker, st *state) error {
	acks := st.heldAcks()
	if len(acks) == 0 {
		return nil
	}
	if err := c.opts.Leases.AckAll(ctx, w.lease, acks); err != nil {
		return err
	}
	c.sent(w, st, acks)
	return nil
}

// pendingLeft reports a source whose own pending entries are not yet
// known to be drained: a run that stopped part way left them.
func (st *state) pendingLeft() bool {
	for _, d := range st.drained {
		if !d {
			return true
		}
	}
	return false
}

// trimEvery is how many acked entries of a stream a worker lets pile up
// before it trims the stream (it also trims when an idle wait times out).
const trimEvery = 256

// start claims the positions row (a new generation, before anything is
// handled), reclaims the previous owners' pending entries and deletes
// their then empty consumers (one per earlier lease generation).
func (c *Consumer) start(w *worker) (*state, error) {
	var row position.Row
	if w.claimed != nil { // claimed with the placement's others (wonAll)
		row, w.claimed = *w.claimed, nil
	} else {
		var err error
		if row, err = c.opts.Positions.Claim(c.work, w.lease.Group, w.lease.Unit); err != nil {
			return nil, fmt.Errorf("claim positions: %w", err)
		}
	}
	st := &state{generation: row.Generation, positions: row.Positions, drained: map[string]bool{}, untrimmed: map[string]int{},
		first: map[string][]Entry{}, after: map[string]string{}, held: map[string][]string{}}
	if st.positions == nil {
		st.positions = map[string]int64{}
	}
	w.commit(maxPosition(st.positions))
	for _, s := range c.streams(w.snapshot()) {
		// One round trip: reclaim, drop the stale consumers, first read.
		t, err := c.opts.Leases.Take(c.work, w.lease, s, c.opts.BatchSize)
		if err != nil {
			return nil, err
		}
		if t.Complete {
			st.first[s] = t.Entries
			// Nothing reclaimed: the new generation's consumer has no
			// pending entries, so its reads need not look for them.
			st.drained[s] = t.Moved == 0
		}
		for _, name := range t.Dropped {
			c.log.Debug("partition: deleted stale consumer", "group", w.lease.Group, "partition", w.lease.Unit, "stream", s, "consumer", name)
		}
	}
	return st, nil
}

// maxPosition is the highest of positions (0 for none).
func maxPosition(positions map[string]int64) int64 {
	var at int64
	for _, p := range positions {
		at = max(at, p)
	}
	return at
}

// streams lists each source followed by its backfill lane when lanes are on.
func (c *Consumer) streams(sources []string) []string {
	if !c.opts.Lanes {
		return sources
	}
	out := make([]string, 0, 2*len(sources))
	for _, s := range sources {
		out = append(out, s, s+":"+c.opts.BackfillSuffix)
	}
	return out
}

var errHalted = errors.New("partition halted")

// ErrGap: a partition stream lacks messages that were published to it. A
// message's prev (the global position of the message before it on its
// stream) is past what the worker has applied there, and past what an
// operator accepted: the stream lost what lies between (a Redis that lost
// acknowledged writes). The worker halts the unit at that message rather
// than apply it past them; `partitions resume` goes on without them.
var ErrGap = errors.New("partition stream lost messages")

// drainAll handles at most one batch per source: the primary stream, and
// its backfill lane once the primary has no more. For a correlated unit
// this round-robins across its categories. more reports a source that may
// hold more than was handled (see drain).
func (c *Consumer) drainAll(w *worker, st *state) (total int, more bool, _ error) {
	for _, src := range w.snapshot() {
		n, m, err := c.drain(w, st, src)
		if err != nil {
			return total, more, err
		}
		total += n
		if !m && c.opts.Lanes {
			n, m, err = c.drain(w, st, src+":"+c.opts.BackfillSuffix)
			if err != nil {
				return total, more, err
			}
			total += n
		}
		more = more || m
	}
	return total, more, nil
}

// drain reads one run of stream (own pending entries first, then new
// ones), acks what was applied already, halts at a poison entry or a gap,
// and hands the rest to the delivery core (delivery.Core.Deliver), which
// acks what committed, retries a failing message alone by the policy, its
// attempts counted on the entry in Redis, and halts the unit once they are
// used up.
//
// more reports that the stream may hold entries past the run: the read
// was full, or may have answered own pending entries (readScript answers
// them first: reclaimed from a predecessor, or left by a failure), or the
// run stopped part way. A read of new entries that came back short found
// the stream's end, so the worker goes idle without reading it again: an
// entry published after the read wakes it (as after an empty read).
func (c *Consumer) drain(w *worker, st *state, stream string) (_ int, more bool, _ error) {
	count := c.opts.BatchSize
	pending := !st.drained[stream]
	entries, ok := st.first[stream]
	if ok {
		delete(st.first, stream)
	} else {
		var err error
		acks := st.heldAcks()
		if entries, err = c.opts.Leases.ReadAfter(c.work, w.lease, stream, false, count, st.after[stream], acks...); err != nil {
			return 0, false, err
		}
		c.sent(w, st, acks)
	}
	if n := len(entries); n > 0 && (st.after[stream] == "" || entryLess(st.after[stream], entries[n-1].ID)) {
		st.after[stream] = entries[n-1].ID
	}
	if len(entries) == 0 {
		// Own pending entries are answered first: none are left.
		st.drained[stream] = true
		return 0, false, nil
	}
	more = pending || len(entries) >= count
	// Already applied (redelivered after a crash between commit and ack),
	// or deleted while pending: ack without handling.
	var skip []string
	// Sized once: a Message is large, and growing the run by appending
	// copied it over and over (a quarter of drain's CPU at 1,000 keys).
	msgs := make([]delivery.Message, 0, len(entries))
	ids := make([]string, 0, len(entries))
	var poison error
	var gap int64       // the poison is a gap ending at this position
	var poisonID string // the poison's message id, when it decoded
	// reached is the last global position the run applies before the
	// entry at hand: a message whose prev is past it (and past what an
	// operator accepted) follows messages the stream lost. 0: unknown
	// (nothing applied on the stream yet), no check.
	reached := st.positions[stream]
	for _, e := range entries {
		if e.Values == nil {
			skip = append(skip, e.ID)
			continue
		}
		m, err := c.opts.Decode(e.ID, e.Values)
		if err != nil {
			poison = fmt.Errorf("entry %s of %s: %w", e.ID, stream, err)
			ids = append(ids, e.ID)
			break
		}
		m.Stream = stream
		if m.GlobalPosition > 0 && m.GlobalPosition <= st.positions[stream] {
			skip = append(skip, e.ID)
			c.opts.Metrics.handled(w.lease.Group, "duplicate", 1)
			continue
		}
		if m.Prev > 0 && reached > 0 && m.Prev > reached {
			accepted, err := c.opts.Leases.Accepted(c.work, w.lease, stream)
			if err != nil {
				return 0, false, err
			}
			if m.Prev > accepted {
				poison, gap = fmt.Errorf("entry %s of %s, message %s at global position %d: the stream lacks the messages after %d up to %d "+
					"(published, then lost: did Redis lose acknowledged writes?); partitions resume goes on without them: %w",
					e.ID, stream, m.ID, m.GlobalPosition, max(reached, accepted), m.Prev, ErrGap), m.Prev
				poisonID = m.ID
				ids = append(ids, e.ID)
				c.opts.Metrics.handled(w.lease.Group, "gap", 1)
				break
			}
		}
		msgs = append(msgs, m)
		ids = append(ids, e.ID)
		if m.GlobalPosition > 0 {
			reached = m.GlobalPosition
		}
	}
	if len(skip) > 0 {
		if err := c.ack(c.work, w, st, stream, skip); err != nil {
			return 0, false, err
		}
	}
	done := 0
	if len(msgs) > 0 {
		r := &run{c: c, w: w, st: st, stream: stream, msgs: msgs, ids: ids}
		var err error
		done, err = c.core.Deliver(w.ctx, c.work, r, len(msgs))
		if done < len(msgs) {
			st.drained[stream] = false // the rest of the run stays pending
		}
		switch {
		case errors.Is(err, delivery.ErrInterrupted):
			return done + len(skip), true, nil // the run loop sees the stop
		case err != nil:
			return done + len(skip), true, err
		case done < len(msgs):
			return done + len(skip), true, nil
		}
	}
	if poison != nil {
		return done + len(skip), false, c.halt(w, st, stream, ids[len(msgs)], poisonID, poison, 1, gap)
	}
	return done + len(skip), more, nil
}

// run is a partition stream's batch as the delivery core's unit: ids[i]
// is the stream entry of msgs[i].
type run struct {
	c      *Consumer
	w      *worker
	st     *state
	stream string
	msgs   []delivery.Message
	ids    []string
}

func (r *run) batch(from, to int) delivery.Batch {
	return delivery.Batch{Group: r.w.lease.Group, Unit: r.w.lease.Unit, Source: r.stream, Generation: r.st.generation, Messages: r.msgs[from:to]}
}

func (r *run) Handle(ctx context.Context, from, to int) (int, error) {
	start := r.c.opts.Clock.Now()
	done, err := r.c.opts.Handler.Handle(ctx, r.batch(from, to))
	r.c.opts.Metrics.batch(r.w.lease.Group, r.c.opts.Clock.Now().Sub(start))
	return done, err
}

// Handled acks what committed (or what the positions already cover).
func (r *run) Handled(ctx context.Context, from, to int) error {
	if gp := delivery.LastGlobalPosition(r.msgs[from:to]); gp > r.st.positions[r.stream] {
		r.st.positions[r.stream] = gp
		r.w.commit(gp)
	}
	if err := r.c.ack(ctx, r.w, r.st, r.stream, r.ids[from:to]); err != nil {
		return err
	}
	r.c.opts.Metrics.handled(r.w.lease.Group, "ok", to-from)
	return nil
}

// Resync reads the positions again after the handler found a message
// applied: our view was behind the table's.
func (r *run) Resync(ctx context.Context, i int) (int, error) {
	row, ok, err := r.c.opts.Positions.Get(ctx, r.w.lease.Group, r.w.lease.Unit)
	if err != nil {
		return 0, err
	}
	if !ok || row.Generation != r.st.generation {
		return 0, fmt.Errorf("positions row moved: %w", position.ErrFenced)
	}
	r.st.positions = row.Positions
	if r.st.positions == nil {
		r.st.positions = map[string]int64{}
	}
	r.w.commit(maxPosition(r.st.positions))
	k := 0
	for i+k < len(r.msgs) && r.msgs[i+k].GlobalPosition > 0 && r.msgs[i+k].GlobalPosition <= r.st.positions[r.stream] {
		k++
	}
	return k, nil
}

// Charge counts the failure on the stream entry in Redis, so that a new
// owner goes on counting where this one stopped.
func (r *run) Charge(ctx context.Context, i int) (int, error) {
	r.c.opts.Metrics.handled(r.w.lease.Group, "failed", 1)
	return r.c.opts.Leases.Attempt(ctx, r.w.lease, r.stream, r.ids[i])
}

// GiveUp halts the unit at the message: its later messages wait behind it.
func (r *run) GiveUp(_ context.Context, i, failures int, cause error) (bool, error) {
	return false, r.c.halt(r.w, r.st, r.stream, r.ids[i], r.msgs[i].ID, cause, failures, 0)
}

func (r *run) Attrs(i int) []any {
	return []any{"group", r.w.lease.Group, "partition", r.w.lease.Unit, "stream", r.stream, "entry", r.ids[i], "message_id", r.msgs[i].ID}
}

func (c *Consumer) halt(w *worker, st *state, stream, entry, messageID string, cause error, attempts int, gap int64) error {
	// The entries before the poison were applied: acked before the
	// halt releases the lease.
	if err := c.flush(c.work, w, st); err != nil {
		return err
	}
	h := Halt{Group: w.lease.Group, Unit: w.lease.Unit, Stream: stream, Entry: entry, MessageID: messageID,
		Reason: cause.Error(), Attempts: attempts, HaltedAt: c.opts.Clock.Now(), Gap: gap}
	if err := c.opts.Leases.Halt(c.work, w.lease, h); err != nil {
		return err
	}
	c.log.Error("partition halted on poison message", "group", w.lease.Group, "partition", w.lease.Unit, "stream", stream,
		"entry", entry, "message_id", messageID, "attempts", attempts, "max_retries", c.opts.Retry.MaxRetries, "error", cause)
	return errHalted
}

// reap tries to retire an idle unit: each of its partition keys leaves its
// category's index and its streams are deleted when every group is caught
// up. A correlated unit is retired only when all its categories reap.
func (c *Consumer) reap(w *worker, st *state) (bool, error) {
	// A held ack is a pending entry: the unit would not look idle.
	if err := c.flush(c.work, w, st); err != nil {
		return false, err
	}
	all := true
	for _, src := range w.snapshot() {
		w.mu.Lock()
		cat := w.cat[src]
		w.mu.Unlock()
		ok, err := c.opts.Leases.Reap(c.work, w.lease, cat, w.key, c.streams([]string{src}), c.opts.ReapIdle)
		if err != nil {
			return false, err
		}
		all = all && ok
	}
	return all, nil
}

// acked counts n acked entries of stream and trims the stream once enough
// have piled up (or, with idle, if any have): entries every consumer group
// acked are deleted, so a busy partition's stream stays short. A failed
// trim is logged and retried later; it never fails the worker.
func (c *Consumer) acked(w *worker, st *state, stream string, n int, idle bool) {
	st.untrimmed[stream] += n
	if st.untrimmed[stream] == 0 || (!idle && st.untrimmed[stream] < trimEvery) {
		return
	}
	if _, err := c.opts.Leases.Trim(c.work, stream); err != nil {
		c.log.Warn("partition stream trim failed", "group", w.lease.Group, "partition", w.lease.Unit, "stream", stream, "error", err)
		return
	}
	delete(st.untrimmed, stream)
}
