package host

import (
	"container/list"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Turns at the cores for long guest calls.
//
// The slots (fairshare.go) bound how many calls a tenant runs, not where
// their CPU goes: at its default max_concurrency (GOMAXPROCS) one tenant's
// CPU-bound calls ran on every P at once. Go then reads ready connections
// only from sysmon, every 10 ms (a P looks at the network when it finds
// nothing else to run, and the guests' Gosched kept its run queue full),
// so another tenant's command waited up to 10 ms for each read of its way
// and its p99 went 14x its quiet figure (BenchmarkNoisyNeighbourHTTP).
//
// A call becomes a long call once it has run a time slice (1 ms) and
// called into the host longYields times (16 x instrument.Period checks of
// guest code: a short call that waited for a core is not long); from then
// on, at each slice's end (instance.yield), it takes a turn at the cores. Long calls hold at most GOMAXPROCS turns at once, and
// one fewer while more than one tenant has started a call within the last
// activeWindow: that P runs no long guest code, so it reads the network at
// once and runs the other tenants' short calls. Calls shorter than a slice
// (most commands and events) never take a turn, and a tenant alone on the
// host keeps every core.
//
// Turns are served first come, first served: a long call whose slice ends
// while others wait gives its turn to the first of them and queues behind
// them, so long calls share the turns in slices, whatever their tenant. A
// call gives its turn back when it ends and when it calls a host function
// (a load or a stream read waits on a server, not on a core), and takes
// one again at its next slice's end. A wait for a turn ends at the call's
// deadline at the latest (the call is then stopped at its next check), and
// after turnStall (20 ms) in which no turn moved: a holder that blocks
// without reaching a slice's end (asleep in WASI, say) cannot hold the
// others for longer.
//
// What it costs: while other tenants are active, the long calls of all
// tenants share GOMAXPROCS-1 cores (one of two on a 2-core machine), even
// when the others' calls leave that core idle. Each tenant's waits for a
// turn are counted (ShareStats.CoreWaits, CoreWaitSeconds). Modules whose deadline is
// not enforced by instrumentation (DeadlineRuntime, DeadlineOff) never
// yield, and take no turns.

// activeWindow is how recently a tenant must have started a call to count
// as active, for the core kept free of long calls.
const activeWindow = time.Second

// turnStall bounds a wait for a turn while no turn moves: a call holding
// one may block without reaching its slice's end (a guest asleep in WASI's
// poll_oneoff, a slow instance start). Past it the waiting call runs
// anyway, over the limit, until the turns move again: a stuck holder
// costs the others at most this, never their deadline.
const turnStall = 20 * time.Millisecond

// coreTurns is a Scheduler's turns at the cores.
type coreTurns struct {
	// procs is the cores long work may use (0: GOMAXPROCS, read at each
	// turn: Go changes it when a container's CPU limit changes).
	procs int
	// recent and other are the two tenants that most recently started a
	// call, distinct (other is the one before recent); their last starts
	// are in Share.lastCall. Two tenants active within activeWindow keep a
	// core free.
	recent, other atomic.Pointer[Share]
	seenMu        sync.Mutex

	mu      sync.Mutex
	held    int
	waiting list.List     // of *turnWaiter, first come first served
	moved   int64         // when a turn was last kept, taken or given back (Unix ns)
	stall   time.Duration // turnStall
}

type turnWaiter struct {
	ready   chan struct{}
	granted bool // under coreTurns.mu
}

func newCoreTurns() coreTurns { return coreTurns{stall: turnStall} }

// seen records that sh started a call at now (Unix ns).
func (c *coreTurns) seen(sh *Share, now int64) {
	if c.recent.Load() == sh {
		// (Written at most once a millisecond: a tenant's calls on every
		// core would otherwise contend for its cache line.)
		if now-sh.lastCall.Load() >= int64(time.Millisecond) {
			sh.lastCall.Store(now)
		}
		return
	}
	sh.lastCall.Store(now)
	c.seenMu.Lock()
	if r := c.recent.Load(); r != sh {
		c.other.Store(r)
		c.recent.Store(sh)
	}
	c.seenMu.Unlock()
}

// limit is how many turns long calls may hold at now.
func (c *coreTurns) limit(now int64) int {
	r, o := c.recent.Load(), c.other.Load()
	procs := c.procs
	if procs == 0 {
		procs = runtime.GOMAXPROCS(0)
	}
	if procs > 1 && r != nil && o != nil &&
		now-r.lastCall.Load() < int64(activeWindow) && now-o.lastCall.Load() < int64(activeWindow) {
		return procs - 1
	}
	return procs
}

// turn is the end of a slice, at now, of a long call of the tenant: the
// call keeps its turn (held) if no call waits and the limit allows, or
// else gives it to the first waiting and waits for one, until deadline
// (Unix ns; 0: none). It reports whether the call holds a turn after it;
// without one (the deadline passed) the call goes on and is stopped at
// its next check. A nil Share takes no turns: it lets the goroutines
// that can run, run (runtime.Gosched), and reports false.
func (sh *Share) turn(held bool, now, deadline int64) bool {
	if sh == nil {
		runtime.Gosched()
		return false
	}
	c := &sh.s.cores
	lim := c.limit(now)
	c.mu.Lock()
	c.moved = now
	if held && c.waiting.Len() == 0 && c.held <= lim {
		c.mu.Unlock()
		runtime.Gosched() // what else is runnable runs now
		return true
	}
	if held {
		c.held--
	}
	c.handOver(lim)
	if c.waiting.Len() == 0 && c.held < lim {
		c.held++
		c.mu.Unlock()
		runtime.Gosched()
		return true
	}
	w := &turnWaiter{ready: make(chan struct{})}
	e := c.waiting.PushBack(w)
	c.mu.Unlock()
	granted := c.await(w, e, deadline)
	sh.coreWaits.Add(1)
	sh.coreWaitNanos.Add(time.Now().UnixNano() - now)
	return granted
}

// await waits for w's turn (e its place in the queue) until deadline
// (Unix ns; 0: none), or takes one over the limit once no turn has moved
// for c.stall (turnStall). It reports whether the call holds a turn.
func (c *coreTurns) await(w *turnWaiter, e *list.Element, deadline int64) bool {
	var expired <-chan time.Time
	if deadline != 0 {
		t := time.NewTimer(time.Duration(deadline - time.Now().UnixNano()))
		defer t.Stop()
		expired = t.C
	}
	stall := time.NewTicker(c.stall)
	defer stall.Stop()
	for {
		select {
		case <-w.ready:
			return true
		case <-expired:
			c.mu.Lock()
			defer c.mu.Unlock()
			if !w.granted {
				c.waiting.Remove(e)
			}
			return w.granted
		case <-stall.C:
			c.mu.Lock()
			now := time.Now().UnixNano()
			if !w.granted && now-c.moved >= int64(c.stall) {
				c.waiting.Remove(e)
				w.granted = true
				c.held++ // over the limit, until the holders give theirs back
				c.moved = now
			}
			granted := w.granted
			c.mu.Unlock()
			if granted {
				return true
			}
		}
	}
}

// releaseTurn gives a turn the tenant's call holds back (the call's end,
// or its host call).
func (sh *Share) releaseTurn() {
	c := &sh.s.cores
	now := time.Now().UnixNano()
	lim := c.limit(now)
	c.mu.Lock()
	c.moved = now
	c.held--
	c.handOver(lim)
	c.mu.Unlock()
}

// handOver grants turns to the first waiting calls while the limit
// allows. c.mu is held.
func (c *coreTurns) handOver(lim int) {
	for c.held < lim && c.waiting.Len() > 0 {
		w := c.waiting.Remove(c.waiting.Front()).(*turnWaiter)
		w.granted = true
		c.held++
		close(w.ready)
	}
}
