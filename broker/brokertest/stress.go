package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
)

// testStress publishes from many goroutines to several streams while
// several consumers of several groups receive and ack. Without nacks, every
// group must receive every message exactly once, and (if Ordered) each
// consumer must see each publisher's messages of a stream in the order they
// were published: any consumer's deliveries are a subsequence of its
// group's delivery order.
func testStress(t *testing.T, e *env) {
	s := newStress(t, e)
	defer s.cancel()
	s.startConsumers()
	s.publishAll()
	s.await()
	if t.Failed() {
		return
	}
	s.check()
}

// The shape of testStress's load.
const (
	nStreams    = 4
	nPublishers = 6
	nGroups     = 3
	nConsumers  = 2 // per stream and group
)

// stress is one testStress run: its broker, its load and what its
// consumers have seen.
type stress struct {
	t            *testing.T
	e            *env
	b            broker.Broker
	perPublisher int
	groups       []string
	total        int
	hasStats     bool
	ctx          context.Context
	cancel       context.CancelFunc

	mu        sync.Mutex
	seen      map[string]int // group/id -> deliveries
	remaining atomic.Int64
	allSeen   chan struct{}
	consumers sync.WaitGroup
}

// newStress opens the broker and sizes the run (smaller with -short).
func newStress(t *testing.T, e *env) *stress {
	s := &stress{t: t, e: e, b: e.open(nil), perPublisher: 300}
	if testing.Short() {
		s.perPublisher = 60
	}
	s.groups = []string{"g0", "g1", "g2"}
	s.total = nPublishers * s.perPublisher

	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.seen = make(map[string]int)
	s.allSeen = make(chan struct{})
	s.remaining.Store(int64(s.total * nGroups))
	_, s.hasStats = s.b.(broker.Inspector)
	return s
}

// streamOf is the stream of publisher p's i-th message.
func streamOf(p, i int) string { return fmt.Sprintf("s%d", (p*7+i/3)%nStreams) }

// startConsumers starts nConsumers consumers of every stream and group.
func (s *stress) startConsumers() {
	for st := range nStreams {
		for _, g := range s.groups {
			for range nConsumers {
				s.consumers.Add(1)
				go s.consume(fmt.Sprintf("s%d", st), g)
			}
		}
	}
}

// consume receives and acks stream's deliveries to group until the run
// is cancelled, checking each and counting it in seen; the last one
// outstanding closes allSeen.
func (s *stress) consume(stream, group string) {
	t, b, ctx := s.t, s.b, s.ctx
	defer s.consumers.Done()
	last := make(map[int]int) // publisher -> last message index seen
	for n := 0; ; n++ {
		d, err := receive(ctx, b, stream, group)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("receive %s/%s: %v", stream, group, err)
			}
			return
		}
		var p, i int
		if _, err := fmt.Sscanf(d.ID, "p%d-%d", &p, &i); err != nil || d.Stream != stream || d.Attempt != 1 {
			t.Errorf("%s/%s: unexpected delivery %+v", stream, group, d)
		}
		if prev, ok := last[p]; ok && i <= prev && s.e.f.Ordered {
			t.Errorf("%s/%s: %s delivered after p%d-%d", stream, group, d.ID, p, prev)
		}
		last[p] = i
		s.mu.Lock()
		s.seen[group+"/"+d.ID]++
		s.mu.Unlock()
		if err := b.Ack(ctx, stream, group, d.ID); err != nil {
			t.Errorf("ack %s/%s %s: %v", stream, group, d.ID, err)
		}
		if s.hasStats && n%25 == 0 {
			if _, err := b.(broker.Inspector).Stats(ctx, stream, group); err != nil && ctx.Err() == nil {
				t.Errorf("stats %s/%s: %v", stream, group, err)
			}
		}
		if s.remaining.Add(-1) == 0 {
			close(s.allSeen)
		}
	}
}

// publishAll runs nPublishers publishers at once and waits for them all.
func (s *stress) publishAll() {
	var publishers sync.WaitGroup
	for p := range nPublishers {
		publishers.Add(1)
		go func() {
			defer publishers.Done()
			s.publish(p)
		}()
	}
	publishers.Wait()
}

// publish publishes publisher p's messages in batches of 1 to 3, across
// streams.
func (s *stress) publish(p int) {
	for i := 0; i < s.perPublisher; {
		var batch []delivery.Message
		for n := 1 + (i+p)%3; n > 0 && i < s.perPublisher; n-- { // batches of 1 to 3, across streams
			batch = append(batch, msg(streamOf(p, i), fmt.Sprintf("p%d-%d", p, i)))
			i++
		}
		if err := s.b.Publish(s.ctx, batch...); err != nil {
			s.t.Errorf("publisher %d: %v", p, err)
			return
		}
	}
}

// await waits for every delivery (or times out), then stops the
// consumers and waits for them.
func (s *stress) await() {
	select {
	case <-s.allSeen:
	case <-time.After(3 * timeout):
		s.t.Errorf("timed out: %d of %d deliveries outstanding", s.remaining.Load(), s.total*nGroups)
	}
	s.cancel()
	s.consumers.Wait()
}

// check requires that every group saw every message exactly once and
// that every stream and group is left empty (and, with stats, settled).
func (s *stress) check() {
	t, e := s.t, s.e
	var wrong []string
	for p := range nPublishers {
		for i := range s.perPublisher {
			for _, g := range s.groups {
				if n := s.seen[fmt.Sprintf("%s/p%d-%d", g, p, i)]; n != 1 {
					wrong = append(wrong, fmt.Sprintf("%s/p%d-%d x%d", g, p, i, n))
				}
			}
		}
	}
	slices.Sort(wrong)
	require.Empty(t, wrong[:min(len(wrong), 20)], "%d messages not delivered exactly once per group", len(wrong))
	for st := range nStreams {
		for _, g := range s.groups {
			e.empty(fmt.Sprintf("s%d", st), g)
			if s.hasStats {
				require.Equal(t, broker.Stats{}, e.stats(fmt.Sprintf("s%d", st), g))
			}
		}
	}
}

// testCloseHammer closes the broker while publishers and consumers are
// busy: every call must end, with success or ErrClosed.
func testCloseHammer(t *testing.T, e *env) {
	b := e.open(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
	defer cancel()
	var (
		wg        sync.WaitGroup
		delivered atomic.Int64
		enough    = make(chan struct{})
		once      sync.Once
	)
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100_000; i++ {
				err := b.Publish(ctx, msg(fmt.Sprintf("s%d", i%2), fmt.Sprintf("p%d-%d", p, i)))
				if errors.Is(err, broker.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		}()
	}
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream, group := fmt.Sprintf("s%d", c%2), fmt.Sprintf("g%d", c%3)
			for {
				d, err := receive(ctx, b, stream, group)
				if errors.Is(err, broker.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("receive: %v", err)
					return
				}
				if err := b.Ack(ctx, stream, group, d.ID); err != nil && !errors.Is(err, broker.ErrClosed) {
					t.Errorf("ack: %v", err)
				}
				if delivered.Add(1) == 200 {
					once.Do(func() { close(enough) })
				}
			}
		}()
	}
	within(t, enough, "200 deliveries")
	require.NoError(t, b.Close())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	within(t, done, "every goroutine to see ErrClosed")
}
