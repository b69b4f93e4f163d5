package host

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// turnsOf is a scheduler's turns at procs cores, and two tenants of it.
// No wait ends for a stall (turnStall) unless a test sets one.
func turnsOf(procs int) (*coreTurns, *Share, *Share) {
	s := NewScheduler(SchedulerOptions{Slots: 8})
	s.cores.procs = procs
	s.cores.stall = time.Hour
	return &s.cores, s.Tenant("noisy"), s.Tenant("quiet")
}

// bothActive is turnsOf(2) with both tenants active at now: long calls
// may hold one turn.
func bothActive() (*coreTurns, *Share, *Share, int64) {
	c, noisy, quiet := turnsOf(2)
	now := time.Now().UnixNano()
	c.seen(noisy, now)
	c.seen(quiet, now)
	return c, noisy, quiet, now
}

// waiters is how many calls wait for a turn.
func (c *coreTurns) waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting.Len()
}

// holders is how many turns are held.
func (c *coreTurns) holders() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

func TestCoreTurnsAloneATenantHoldsEveryCore(t *testing.T) {
	t.Parallel()
	c, noisy, _ := turnsOf(2)
	now := time.Now().UnixNano()
	c.seen(noisy, now)
	require.Equal(t, 2, c.limit(now))
	require.True(t, noisy.turn(false, now, 0))
	require.True(t, noisy.turn(false, now, 0), "the second core too: no other tenant is active")
	require.True(t, noisy.turn(true, now, 0), "a holder keeps its turn while no call waits")
	require.Zero(t, c.waiters())
}

func TestCoreTurnsKeepACoreFreeWhileTwoTenantsAreActive(t *testing.T) {
	t.Parallel()
	c, noisy, quiet, now := bothActive()
	require.Equal(t, 1, c.limit(now))
	require.True(t, noisy.turn(false, now, 0))

	// The second long call waits, until the first gives its turn back.
	got := make(chan bool)
	go func() { got <- quiet.turn(false, time.Now().UnixNano(), 0) }()
	testwait.True(t, "the second long call waits for a turn", func() bool { return c.waiters() == 1 })
	noisy.releaseTurn()
	require.True(t, testwait.Recv(t, "the waiting call's turn", got))

	// Once the other tenant has been idle for activeWindow, both cores.
	later := now + int64(activeWindow)
	c.seen(noisy, later)
	require.Equal(t, 2, c.limit(later))
	require.True(t, noisy.turn(false, later, 0))
}

func TestCoreTurnsRotateFirstComeFirstServed(t *testing.T) {
	t.Parallel()
	c, noisy, _, now := bothActive()
	require.True(t, noisy.turn(false, now, 0)) // call 0 holds the one turn

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.True(t, noisy.turn(false, time.Now().UnixNano(), 0))
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			noisy.releaseTurn()
		}()
		testwait.True(t, fmt.Sprintf("call %d queued", i), func() bool { return c.waiters() == i })
	}
	// Call 0's slice ends with calls waiting: it gives its turn to the
	// first of them and queues behind the others.
	back := make(chan bool)
	go func() { back <- noisy.turn(true, time.Now().UnixNano(), 0) }()
	require.True(t, testwait.Recv(t, "call 0's next turn", back))
	wg.Wait()
	require.Equal(t, []int{1, 2, 3}, order)
	noisy.releaseTurn()
	require.Zero(t, c.holders(), "every turn given back")
}

func TestCoreTurnsWaitEndsAtTheCallsDeadline(t *testing.T) {
	t.Parallel()
	c, noisy, quiet, now := bothActive()
	require.True(t, noisy.turn(false, now, 0))
	// (A deadline already passed: the wait ends at once, holding nothing.)
	require.False(t, quiet.turn(false, now, now-1))
	require.Zero(t, c.waiters(), "the call that gave up is no longer queued")
	st := noisy.s.Stats()
	require.Equal(t, "quiet", st[1].Tenant)
	require.EqualValues(t, 1, st[1].CoreWaits, "the wait is counted, as the waiting tenant's")
	require.Zero(t, st[0].CoreWaits)
	noisy.releaseTurn()
	require.Zero(t, c.holders())
}

// A holder that blocks without reaching a slice's end holds the others
// for the stall at most: then the waiting call runs over the limit.
func TestCoreTurnsWaitEndsWhenNoTurnMoves(t *testing.T) {
	t.Parallel()
	c, noisy, quiet := turnsOf(1)
	c.stall = 10 * time.Millisecond
	now := time.Now().UnixNano()
	require.True(t, noisy.turn(false, now, 0)) // and never turns again
	got := make(chan bool)
	go func() { got <- quiet.turn(false, time.Now().UnixNano(), 0) }()
	require.True(t, testwait.Recv(t, "the waiting call's turn, over the limit", got))
	require.Equal(t, 2, c.holders())
	require.Zero(t, c.waiters())
	noisy.releaseTurn()
	quiet.releaseTurn()
	require.Zero(t, c.holders())
}

// A host call gives the turn back; so does the call's end.
func TestCoreTurnsOffCore(t *testing.T) {
	t.Parallel()
	c, noisy, _ := turnsOf(1)
	c.seen(noisy, time.Now().UnixNano())
	inst := &instance{share: noisy}
	inst.onCore = noisy.turn(false, time.Now().UnixNano(), 0)
	require.True(t, inst.onCore)
	b := &callBudget{lim: Limits{MaxHostCalls: 10}, inst: inst}
	require.NoError(t, b.enter(t.Context(), "load"))
	require.False(t, inst.onCore)
	require.Zero(t, c.holders())
}

// Two tenants' CPU-bound guest calls (behave's "loop", which runs until
// it is stopped) on a host whose long calls may hold one turn: both wait
// for the turn a third holds, then take turns (each wait counted as its
// tenant's), and once stopped give every turn back.
func TestLongGuestCallsTakeTurns(t *testing.T) {
	w := testwait.Limit()
	l, err := NewLoader(LoaderOptions{Limits: Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w},
		CacheDir: wasmbuild.CacheDir(t), Tenancy: Tenancy{Of: func(m string) string { return m }}})
	require.NoError(t, err)
	l.sched.cores.procs = 1
	l.sched.cores.stall = time.Hour // the test's holder does not move
	dir := t.TempDir()
	src := wasmbuild.Build(t, "./internal/host/testdata/plugins/behave")
	wasmbuild.Copy(t, src, dir, "a.wasm")
	wasmbuild.Copy(t, src, dir, "b.wasm")
	mods, errs := l.LoadDir(context.Background(), dir)
	require.Empty(t, errs)
	t.Cleanup(func() {
		for _, m := range mods {
			_ = m.Close(context.Background())
		}
		_ = l.Close(context.Background())
	})

	holder := l.sched.Tenant("holder")
	require.True(t, holder.turn(false, time.Now().UnixNano(), 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loop := []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op": "loop", "id": "d"}`)}}
	var wg sync.WaitGroup
	for _, m := range mods {
		wg.Go(func() {
			_, err := m.Handle(ctx, "behave", loop, nopSession{})
			require.ErrorIs(t, err, ErrCanceled, "%s", m.File)
		})
	}
	// Each call's long work (its instance's start, then its loop) waits.
	testwait.True(t, "both calls wait for the turn", func() bool { return l.sched.cores.waiters() == 2 })
	holder.releaseTurn()
	testwait.For(t, "both tenants' calls got a turn, then waited for one again", func() (bool, string) {
		a, b := stats(l.sched, "a").CoreWaits, stats(l.sched, "b").CoreWaits
		return a >= 2 && b >= 2, fmt.Sprintf("waits: a %d, b %d", a, b)
	})
	cancel()
	wg.Wait()
	require.Zero(t, l.sched.cores.holders(), "every turn given back")
	require.Zero(t, l.sched.cores.waiters())
}

func stats(s *Scheduler, tenant string) ShareStats {
	for _, st := range s.Stats() {
		if st.Tenant == tenant {
			return st
		}
	}
	return ShareStats{Tenant: tenant}
}

// Without a set number of cores, the limit follows GOMAXPROCS as it is
// now.
func TestCoreTurnsFollowGOMAXPROCS(t *testing.T) {
	c, noisy, _ := turnsOf(0)
	now := time.Now().UnixNano()
	c.seen(noisy, now)
	require.Equal(t, runtime.GOMAXPROCS(0), c.limit(now))
	prev := runtime.GOMAXPROCS(3)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	require.Equal(t, 3, c.limit(now))
}
