package host

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The scheduler shares the host's guest slots between tenants.
//
// max_instances bounds one module; nothing bounded a tenant, so a tenant
// with several modules running CPU-bound calls to their deadline took
// every core and slowed another tenant's command 6.5-29x (issue 21). A
// guest call now takes a slot of its tenant's share before it takes an
// instance, and holds it until the call ends:
//
//   - Slots are host-wide (guest_concurrency, 2 x GOMAXPROCS by default).
//   - A tenant runs at most max_concurrency calls at once (by default half
//     the slots: GOMAXPROCS, enough for one tenant alone to keep every core
//     busy). A slot cannot be taken back from a running guest, so a tenant
//     that could fill every slot would make the next tenant's call wait for
//     one of its calls to end, a whole deadline at worst; the half it
//     cannot take is where another tenant's call starts at once.
//   - When no slot is free, calls queue per tenant, and each freed slot
//     goes to the queued tenant with the least weighted usage: start-time
//     fair queueing, where each grant advances its tenant's virtual finish
//     by 1/weight from max(its finish, the virtual time of the last grant).
//     A tenant idle for a while gets no credit for it, a tenant with many
//     modules or callers gets its weight's share of the grants, and a
//     tenant with one caller is served at the next free slot.
//   - calls_per_second, when set, is a token bucket (burst: one second's
//     calls) that a call waits on before it queues for a slot.
//
// The wait for the bucket and the slot is part of the call's deadline; a
// call that does not get its slot within it fails with a *QueueError,
// which matches ErrNoInstance: the host ran out of room, not the guest.
//
// An uncontended call pays a few atomic operations (no lock): the fast
// path takes the tenant's count and a slot with compare-and-swap while no
// call is queued (BenchmarkShare).
//
// Slots bound calls, not cores: a call waiting on a server holds its slot
// without using a core. Where the CPU goes between long calls is the
// Scheduler's turns at the cores (cores.go).

// DefaultGuestConcurrency is the guest slots of a host whose config says
// nothing: twice GOMAXPROCS. A guest waiting on a host call (a load, a
// stream read) holds its slot without using a core; twice the cores keeps
// the cores busy through such waits, and leaves room beside a tenant at
// its default max_concurrency (GOMAXPROCS).
func DefaultGuestConcurrency() int { return 2 * runtime.GOMAXPROCS(0) }

// ShareOptions are one tenant's share of the guest slots ([tenants.NAME]
// weight, max_concurrency, calls_per_second).
type ShareOptions struct {
	// Weight is the tenant's share of contended slots relative to other
	// tenants' (0 means 1).
	Weight int
	// MaxConcurrency caps the tenant's calls running at once (0: half the
	// slots, at least 1; more than the slots: the slots).
	MaxConcurrency int
	// CallsPerSecond caps the rate at which the tenant's calls start (0:
	// no cap); a call over it waits, within its deadline.
	CallsPerSecond float64
}

// SchedulerOptions configure a Scheduler.
type SchedulerOptions struct {
	// Slots is how many guest calls run at once on the host (0:
	// DefaultGuestConcurrency).
	Slots int
	// Tenants are the tenants' shares by name; a tenant not named has the
	// zero ShareOptions.
	Tenants map[string]ShareOptions
}

// QueueError is a call that did not get its tenant's share within its
// deadline: every slot it may take stayed busy, or its calls_per_second
// let it start no sooner. It matches ErrNoInstance under errors.Is.
type QueueError struct {
	Tenant string
	// What the call waited for: "a guest slot" or "calls_per_second".
	Waited string
	Err    error // the context's error
}

func (e *QueueError) Error() string {
	return fmt.Sprintf("tenant %s: waited for %s for the whole deadline: %v", e.Tenant, e.Waited, e.Err)
}

// Unwrap returns the context's error.
func (e *QueueError) Unwrap() error { return e.Err }

// Is makes a QueueError match ErrNoInstance.
func (e *QueueError) Is(target error) bool { return target == ErrNoInstance }

// Scheduler shares a host's guest slots between tenants (see above). It
// starts no goroutine; the zero value is not useful, use NewScheduler.
type Scheduler struct {
	slots int64
	inUse atomic.Int64
	// queued counts the calls waiting for a slot; while it is 0 a call
	// takes the fast path.
	queued atomic.Int64
	// vnow is the virtual start of the latest grant (see charge).
	vnow atomic.Int64
	opts map[string]ShareOptions

	// cores are the long calls' turns at the cores (cores.go).
	cores coreTurns

	mu     sync.Mutex
	shares map[string]*Share
	order  []*Share // in creation order, for Stats
	seq    uint64   // arrival order of waiters, to break ties
}

// virtualUnit is a grant's virtual cost at weight 1.
const virtualUnit = 1 << 20

// NewScheduler returns a Scheduler.
func NewScheduler(opts SchedulerOptions) *Scheduler {
	slots := opts.Slots
	if slots <= 0 {
		slots = DefaultGuestConcurrency()
	}
	return &Scheduler{slots: int64(slots), opts: opts.Tenants, shares: map[string]*Share{}, cores: newCoreTurns()}
}

// Slots is how many guest calls may run at once.
func (s *Scheduler) Slots() int { return int(s.slots) }

// Tenant returns the share of tenant ("" is DefaultTenant), made on first
// use. A nil Scheduler returns nil, whose Take and Done do nothing.
func (s *Scheduler) Tenant(tenant string) *Share {
	if s == nil {
		return nil
	}
	tenant = tenantOf(tenant)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh, ok := s.shares[tenant]; ok {
		return sh
	}
	o := s.opts[tenant]
	w := int64(max(1, o.Weight))
	limit := int64(o.MaxConcurrency)
	if limit <= 0 {
		limit = max(1, s.slots/2)
	}
	sh := &Share{s: s, name: tenant, weight: int(w), cost: virtualUnit / w, max: min(limit, s.slots)}
	if o.CallsPerSecond > 0 {
		sh.rate = newBucket(o.CallsPerSecond, max(1, o.CallsPerSecond))
	}
	s.shares[tenant] = sh
	s.order = append(s.order, sh)
	return sh
}

// Share is one tenant's share of a Scheduler's slots.
type Share struct {
	s       *Scheduler
	name    string
	weight  int
	cost    int64 // virtual time one grant costs: virtualUnit / weight
	max     int64
	rate    *bucket // nil: no calls_per_second
	running atomic.Int64
	finish  atomic.Int64 // virtual finish of the tenant's latest grant
	// lastCall is when the tenant last started a call (Unix ns, see
	// coreTurns.seen); coreWaits and coreWaitNanos count its long calls'
	// waits for a turn at the cores (cores.go).
	lastCall                 atomic.Int64
	coreWaits, coreWaitNanos atomic.Int64
	queue                    list.List // of *waiter, under s.mu

	calls, gaveUp atomic.Int64
	waits         [len(WaitBuckets) + 1]atomic.Int64
	waitNanos     atomic.Int64
	// ranNanos is the wall time the tenant's calls ran in an instance
	// (see Module.ran): kept here, the tenant's total survives reloads.
	ranNanos atomic.Int64
}

type waiter struct {
	ready   chan struct{}
	granted bool // under s.mu
	seq     uint64
}

// WaitBuckets are the upper bounds, in seconds, of the histogram of
// ShareStats.Waits.
var WaitBuckets = [...]float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Take waits for the tenant's calls_per_second and a slot, until ctx
// ends; then it returns a *QueueError and holds nothing. After a nil
// error the caller must call Done once.
func (sh *Share) Take(ctx context.Context) error {
	if sh == nil {
		return nil
	}
	sh.s.cores.seen(sh, time.Now().UnixNano())
	var start time.Time
	if sh.rate != nil {
		start = time.Now()
		if err := sh.rate.wait(ctx); err != nil {
			sh.gaveUp.Add(1)
			return &QueueError{Tenant: sh.name, Waited: "calls_per_second", Err: err}
		}
	}
	if sh.s.queued.Load() == 0 && sh.tryTake(false) {
		sh.granted(start)
		return nil
	}
	if start.IsZero() {
		start = time.Now()
	}
	return sh.wait(ctx, start)
}

// Done gives the slot back: to the queued tenant with the least weighted
// usage, if any call is queued.
func (sh *Share) Done() {
	if sh == nil {
		return
	}
	sh.running.Add(-1)
	sh.s.inUse.Add(-1)
	if sh.s.queued.Load() > 0 {
		sh.s.mu.Lock()
		sh.s.dispatch()
		sh.s.mu.Unlock()
	}
}

// tryTake takes one of the tenant's max and one of the host's slots, and
// charges the tenant, or takes nothing. locked: s.mu is held (by
// dispatch).
func (sh *Share) tryTake(locked bool) bool {
	for {
		n := sh.running.Load()
		if n >= sh.max {
			return false
		}
		if sh.running.CompareAndSwap(n, n+1) {
			break
		}
	}
	for {
		n := sh.s.inUse.Load()
		if n >= sh.s.slots {
			// Giving the tenant's count back is a release: a call of the
			// tenant that queued meanwhile, seeing it taken, is served.
			sh.running.Add(-1)
			if !locked && sh.s.queued.Load() > 0 {
				sh.s.mu.Lock()
				sh.s.dispatch()
				sh.s.mu.Unlock()
			}
			return false
		}
		if sh.s.inUse.CompareAndSwap(n, n+1) {
			break
		}
	}
	sh.charge()
	return true
}

// charge advances the tenant's virtual finish by its cost, from the later
// of its finish and the virtual time of the latest grant.
func (sh *Share) charge() {
	for {
		f, v := sh.finish.Load(), sh.s.vnow.Load()
		start := max(f, v)
		if sh.finish.CompareAndSwap(f, start+sh.cost) {
			for {
				v := sh.s.vnow.Load()
				if start <= v || sh.s.vnow.CompareAndSwap(v, start) {
					return
				}
			}
		}
	}
}

// next is the virtual start of the tenant's next grant.
func (sh *Share) next() int64 { return max(sh.finish.Load(), sh.s.vnow.Load()) }

// wait queues the call and waits for dispatch to grant it a slot.
func (sh *Share) wait(ctx context.Context, start time.Time) error {
	s := sh.s
	s.queued.Add(1)
	s.mu.Lock()
	s.seq++
	w := &waiter{ready: make(chan struct{}, 1), seq: s.seq}
	e := sh.queue.PushBack(w)
	s.dispatch()
	s.mu.Unlock()
	select {
	case <-w.ready:
		sh.granted(start)
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.granted { // granted as ctx ended: give it back
		s.mu.Unlock()
		sh.Done()
	} else {
		sh.queue.Remove(e)
		s.queued.Add(-1)
		s.mu.Unlock()
	}
	sh.gaveUp.Add(1)
	return &QueueError{Tenant: sh.name, Waited: "a guest slot", Err: ctx.Err()}
}

// dispatch grants free slots to queued calls, each to the tenant whose
// next virtual start is least (ties: the longest waiting), among tenants
// below their max_concurrency. s.mu is held.
func (s *Scheduler) dispatch() {
	for s.queued.Load() > 0 {
		var best *Share
		var bestStart int64
		var bestSeq uint64
		for _, sh := range s.order {
			if sh.queue.Len() == 0 || sh.running.Load() >= sh.max {
				continue
			}
			st, sq := sh.next(), sh.queue.Front().Value.(*waiter).seq
			if best == nil || st < bestStart || st == bestStart && sq < bestSeq {
				best, bestStart, bestSeq = sh, st, sq
			}
		}
		if best == nil || !best.tryTake(true) {
			return
		}
		w := best.queue.Remove(best.queue.Front()).(*waiter)
		w.granted = true
		s.queued.Add(-1)
		w.ready <- struct{}{}
	}
}

// ran counts d, the wall time one of the tenant's calls ran.
func (sh *Share) ran(d time.Duration) {
	if sh != nil {
		sh.ranNanos.Add(int64(d))
	}
}

func (sh *Share) granted(start time.Time) {
	sh.calls.Add(1)
	var d time.Duration
	if !start.IsZero() {
		d = time.Since(start)
		sh.waitNanos.Add(int64(d))
	}
	i := 0
	for i < len(WaitBuckets) && d.Seconds() > WaitBuckets[i] {
		i++
	}
	sh.waits[i].Add(1)
}

// ShareStats are one tenant's use of the slots: its weight and
// max_concurrency, its calls running and queued now, the calls granted a
// slot and those that gave up waiting, and how long granted calls waited
// (Waits[i] counts waits of at most WaitBuckets[i] seconds and above the
// bucket before; the last counts the rest; WaitSeconds is their sum).
// GuestSeconds is the wall time its calls ran in an instance (see
// TenantStats.GuestSeconds), since the host started.
type ShareStats struct {
	Tenant         string
	Weight         int
	MaxConcurrency int
	Running        int
	Queued         int
	Calls          int64
	GaveUp         int64
	Waits          [len(WaitBuckets) + 1]int64
	WaitSeconds    float64
	GuestSeconds   float64
	// CoreWaits counts the waits of the tenant's long calls (and instance
	// starts) for a turn at the cores, CoreWaitSeconds their sum
	// (cores.go).
	CoreWaits       int64
	CoreWaitSeconds float64
}

// WaitQuantile bounds the q-quantile (0 < q <= 1) of the granted calls'
// waits by the histogram: the upper bound of the first bucket (seconds)
// whose calls reach q of them, +Inf if only the last bucket does, 0 with
// no call. Enough for a person to tell 1 ms from 1 s, no more.
func (st ShareStats) WaitQuantile(q float64) float64 {
	var n int64
	for _, c := range st.Waits {
		n += c
	}
	if n == 0 {
		return 0
	}
	var seen int64
	for i, le := range WaitBuckets {
		seen += st.Waits[i]
		if float64(seen) >= q*float64(n) {
			return le
		}
	}
	return math.Inf(1)
}

// Stats reads each tenant's share, in the order the tenants were first
// seen.
func (s *Scheduler) Stats() []ShareStats {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ShareStats, 0, len(s.order))
	for _, sh := range s.order {
		st := ShareStats{Tenant: sh.name, Weight: sh.weight, MaxConcurrency: int(sh.max), Running: int(sh.running.Load()),
			Queued: sh.queue.Len(), Calls: sh.calls.Load(), GaveUp: sh.gaveUp.Load(),
			WaitSeconds: time.Duration(sh.waitNanos.Load()).Seconds(), GuestSeconds: time.Duration(sh.ranNanos.Load()).Seconds(),
			CoreWaits: sh.coreWaits.Load(), CoreWaitSeconds: time.Duration(sh.coreWaitNanos.Load()).Seconds()}
		for i := range sh.waits {
			st.Waits[i] = sh.waits[i].Load()
		}
		out = append(out, st)
	}
	return out
}

// bucket is a token bucket that lends ahead: a call takes a token now or
// waits until the one it took is due.
type bucket struct {
	mu          sync.Mutex
	tokens      float64
	rate, burst float64
	last        time.Time
}

func newBucket(rate, burst float64) *bucket {
	return &bucket{tokens: burst, rate: rate, burst: burst}
}

// reserve takes a token and returns how long until it is due.
func (b *bucket) reserve(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// unreserve gives back a token a call took and will not use.
func (b *bucket) unreserve() {
	b.mu.Lock()
	b.tokens = min(b.burst, b.tokens+1)
	b.mu.Unlock()
}

// wait takes a token, waiting until it is due; a token not due before
// ctx's deadline is given back at once.
func (b *bucket) wait(ctx context.Context) error {
	now := time.Now()
	d := b.reserve(now)
	if d == 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		b.unreserve()
		return context.DeadlineExceeded
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		b.unreserve()
		return ctx.Err()
	}
}

// admit takes the module's tenant's share within callCtx (the call's
// deadline); ctx is the caller's own, to tell a cancellation. After a nil
// error, m.share.Done gives it back.
func (m *Module) admit(callCtx, ctx context.Context) error {
	err := m.share.Take(callCtx)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: waiting for tenant %s's share: %v", ErrCanceled, m.Tenant, ctx.Err())
	}
	return err
}
