package host_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// stats returns tenant's ShareStats.
func stats(s *host.Scheduler, tenant string) host.ShareStats {
	for _, st := range s.Stats() {
		if st.Tenant == tenant {
			return st
		}
	}
	return host.ShareStats{Tenant: tenant}
}

// waitQueued waits until tenant has n calls queued.
func waitQueued(t *testing.T, s *host.Scheduler, tenant string, n int) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d calls of %s queued", n, tenant), func() (bool, string) {
		st := stats(s, tenant)
		return st.Queued == n, fmt.Sprintf("%d queued", st.Queued)
	})
}

// grants runs one caller per tenant listed, each queued (in list order)
// behind holder, which holds the only slot; then frees the slot and
// returns the tenants in the order they were granted it.
func grants(t *testing.T, s *host.Scheduler, holder *host.Share, tenants []string) []string {
	t.Helper()
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	queued := map[string]int{}
	for _, name := range tenants {
		sh := s.Tenant(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sh.Take(context.Background()); err != nil {
				t.Error(err)
				return
			}
			// One slot: the next call is granted only after Done, so the
			// order recorded is the order granted.
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			sh.Done()
		}()
		queued[name]++
		waitQueued(t, s, name, queued[name])
	}
	holder.Done()
	wg.Wait()
	return order
}

// A tenant with one caller is served at the next free slot, ahead of the
// queue of a tenant of the same weight that had the slot before (the
// change that fails it: granting in arrival order, or charging no
// virtual time on the fast path).
func TestShareServesAQuietTenantAtTheNextSlot(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := host.NewScheduler(host.SchedulerOptions{Slots: 1})
	noisy := s.Tenant("noisy")
	require.NoError(t, noisy.Take(context.Background()))
	order := grants(t, s, noisy, []string{"noisy", "noisy", "noisy", "noisy", "noisy", "quiet"})
	require.Equal(t, []string{"quiet", "noisy", "noisy", "noisy", "noisy", "noisy"}, order)
	for _, st := range s.Stats() {
		require.Zero(t, st.Running, st.Tenant)
		require.Zero(t, st.Queued, st.Tenant)
	}
}

// Weights 2:1 give 2:1 grants while both tenants are queued.
func TestShareGrantsByWeight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := host.NewScheduler(host.SchedulerOptions{Slots: 1, Tenants: map[string]host.ShareOptions{"a": {Weight: 2}, "b": {Weight: 1}}})
	holder := s.Tenant("c")
	require.NoError(t, holder.Take(context.Background()))
	var callers []string
	for range 30 {
		callers = append(callers, "a")
	}
	for range 30 {
		callers = append(callers, "b")
	}
	order := grants(t, s, holder, callers)
	count := map[string]int{}
	for _, name := range order[:30] {
		count[name]++
	}
	require.Equal(t, map[string]int{"a": 20, "b": 10}, count, "the first 30 grants: %v", order)
	require.Equal(t, int64(30), stats(s, "a").Calls)
}

// A call whose context ends in the queue fails with a *QueueError that
// matches ErrNoInstance, leaves the queue, and holds no slot: the slot
// count stays right (the next call takes the slot at once).
func TestShareCallThatTimesOutInTheQueueHoldsNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := host.NewScheduler(host.SchedulerOptions{Slots: 1})
	a, b := s.Tenant("a"), s.Tenant("b")
	require.NoError(t, a.Take(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Take(ctx) }()
	waitQueued(t, s, "b", 1)
	cancel()
	err := testwait.Recv(t, "the queued call to give up", done)
	require.ErrorIs(t, err, host.ErrNoInstance)
	require.ErrorIs(t, err, context.Canceled)
	var qe *host.QueueError
	require.ErrorAs(t, err, &qe)
	require.Equal(t, "b", qe.Tenant)
	require.Equal(t, host.ShareStats{Tenant: "b", Weight: 1, MaxConcurrency: 1, GaveUp: 1}, stats(s, "b"))
	a.Done()
	// The slot is free, and only one: b takes it, a then waits.
	require.NoError(t, b.Take(context.Background()))
	short, cancelShort := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelShort()
	require.ErrorIs(t, a.Take(short), host.ErrNoInstance)
	b.Done()
	require.Zero(t, stats(s, "a").Running)
	require.Zero(t, stats(s, "b").Running)
}

// max_concurrency caps a tenant even with slots free, and another tenant
// takes them.
func TestShareMaxConcurrency(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := host.NewScheduler(host.SchedulerOptions{Slots: 4, Tenants: map[string]host.ShareOptions{"a": {MaxConcurrency: 1}}})
	a, b := s.Tenant("a"), s.Tenant("b")
	require.Equal(t, 2, stats(s, "b").MaxConcurrency, "by default half the slots")
	require.NoError(t, a.Take(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Take(ctx) }()
	waitQueued(t, s, "a", 1)
	require.NoError(t, b.Take(context.Background()), "slots are free for another tenant")
	a.Done()
	require.NoError(t, testwait.Recv(t, "a's queued call, at its own release", done))
	a.Done()
	b.Done()
	cancel()
}

// calls_per_second: a call that cannot start within its deadline fails
// at once with a *QueueError naming what it waited for, and gives its
// token back.
func TestShareCallsPerSecond(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := host.NewScheduler(host.SchedulerOptions{Slots: 2, Tenants: map[string]host.ShareOptions{"a": {CallsPerSecond: 0.001}}})
	a := s.Tenant("a")
	require.NoError(t, a.Take(context.Background()), "a burst of one")
	a.Done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // its token is due in 1000 s
	defer cancel()
	err := a.Take(ctx)
	var qe *host.QueueError
	require.ErrorAs(t, err, &qe)
	require.Equal(t, "calls_per_second", qe.Waited)
	require.ErrorIs(t, err, host.ErrNoInstance)
	require.Zero(t, stats(s, "a").Running)
	require.NoError(t, s.Tenant("b").Take(context.Background()), "another tenant is not limited")
	s.Tenant("b").Done()
}

// Hammer: callers of three tenants with random deadlines never hold more
// than the slots or a tenant's max_concurrency, and when all are done
// nothing is held or queued.
func TestShareHammer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const slots = 3
	s := host.NewScheduler(host.SchedulerOptions{Slots: slots, Tenants: map[string]host.ShareOptions{
		"a": {Weight: 3, MaxConcurrency: 2}, "b": {Weight: 1}, "c": {Weight: 1, MaxConcurrency: 1}}})
	var inUse atomic.Int64
	per := map[string]*atomic.Int64{"a": {}, "b": {}, "c": {}}
	var wg sync.WaitGroup
	var errs atomic.Int64
	for i := range 60 {
		name := []string{"a", "b", "c"}[i%3]
		sh := s.Tenant(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(200))*time.Microsecond)
				err := sh.Take(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, host.ErrNoInstance) {
						t.Error(err)
					}
					errs.Add(1)
					continue
				}
				if n := inUse.Add(1); n > slots {
					t.Errorf("%d calls hold %d slots", n, slots)
				}
				if n := per[name].Add(1); n > int64(stats(s, name).MaxConcurrency) {
					t.Errorf("tenant %s holds %d", name, n)
				}
				per[name].Add(-1)
				inUse.Add(-1)
				sh.Done()
			}
		}()
	}
	wg.Wait()
	var calls int64
	for _, st := range s.Stats() {
		require.Zero(t, st.Running, st.Tenant)
		require.Zero(t, st.Queued, st.Tenant)
		calls += st.Calls + st.GaveUp
	}
	require.Equal(t, int64(60*50), calls)
	// Every slot is free: all can be taken without waiting.
	for _, name := range []string{"a", "a", "b"} {
		require.NoError(t, s.Tenant(name).Take(context.Background()))
	}
	t.Logf("%d calls gave up", errs.Load())
}

// A module's call takes its tenant's share before an instance: with the
// one guest slot held by another module of the tenant, a call fails at its
// deadline with a *QueueError (an ErrNoInstance), though its own module
// has instances free. Without the hook in Handle it would run.
func TestHandleWaitsForItsTenantsShare(t *testing.T) {
	// The holder runs under the suite's generous deadline (creating its
	// instance under -race takes a while); the waiter's is short.
	limits := func(module string) host.Limits {
		if module == "holder" {
			return generous(host.Limits{})
		}
		return generous(host.Limits{Timeout: 300 * time.Millisecond})
	}
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), TenantLimits: limits,
		Instances: 2, GuestConcurrency: 1, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	src := wasmbuild.Build(t, "./internal/host/testdata/plugins/behave")
	dir := t.TempDir()
	holder, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, src, dir, "holder.wasm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, src, dir, "behave.wasm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	s := &blockingSession{entered: make(chan struct{}, 1), release: make(chan struct{})}
	first := make(chan error, 1)
	go func() {
		_, err := holder.Handle(context.Background(), "behave", ops("load"), s)
		first <- err
	}()
	testwait.Recv(t, "the holder's call to hold the only slot", s.entered)
	_, err = m.Handle(context.Background(), "behave", ops("ok"), &memSession{})
	require.ErrorIs(t, err, host.ErrNoInstance)
	var qe *host.QueueError
	require.ErrorAs(t, err, &qe)
	require.Equal(t, host.DefaultTenant, qe.Tenant)
	var ce *host.CallError
	require.ErrorAs(t, err, &ce)
	require.GreaterOrEqual(t, ce.Waited, 300*time.Millisecond)
	require.Zero(t, m.Instances().Created, "it waited before taking an instance")
	close(s.release)
	require.NoError(t, testwait.Recv(t, "the holder's call to end", first))
	st := l.Scheduler().Stats()
	require.Len(t, st, 1)
	require.Equal(t, int64(1), st[0].Calls)
	require.Equal(t, int64(1), st[0].GaveUp)
	require.Zero(t, st[0].Running)
	_, err = holder.Handle(context.Background(), "behave", ops("ok"), &memSession{})
	require.NoError(t, err, "the slot was given back")
}

// BenchmarkShare is what the share costs an uncontended call (Take and
// Done with slots free, nothing queued) beside no share at all (a nil
// Share, the loader's GuestConcurrency < 0), and from every core at once.
func BenchmarkShare(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		sh   *host.Share
	}{
		{"none", nil},
		{"share", host.NewScheduler(host.SchedulerOptions{Slots: 1 << 20}).Tenant("a")},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.sh.Take(ctx); err != nil {
					b.Fatal(err)
				}
				c.sh.Done()
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.sh.Take(ctx); err != nil {
						b.Fatal(err)
					}
					c.sh.Done()
				}
			})
		})
	}
}
