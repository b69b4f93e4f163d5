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
	b := e.open(nil)
	const (
		nStreams    = 4
		nPublishers = 6
		nGroups     = 3
		nConsumers  = 2 // per stream and group
	)
	perPublisher := 300
	if testing.Short() {
		perPublisher = 60
	}
	streamOf := func(p, i int) string { return fmt.Sprintf("s%d", (p*7+i/3)%nStreams) }
	groups := []string{"g0", "g1", "g2"}
	total := nPublishers * perPublisher

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu        sync.Mutex
		seen      = make(map[string]int) // group/id -> deliveries
		remaining atomic.Int64
		allSeen   = make(chan struct{})
		consumers sync.WaitGroup
	)
	remaining.Store(int64(total * nGroups))
	_, hasStats := b.(broker.Inspector)

	consume := func(stream, group string) {
		defer consumers.Done()
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
			if prev, ok := last[p]; ok && i <= prev && e.f.Ordered {
				t.Errorf("%s/%s: %s delivered after p%d-%d", stream, group, d.ID, p, prev)
			}
			last[p] = i
			mu.Lock()
			seen[group+"/"+d.ID]++
			mu.Unlock()
			if err := b.Ack(ctx, stream, group, d.ID); err != nil {
				t.Errorf("ack %s/%s %s: %v", stream, group, d.ID, err)
			}
			if hasStats && n%25 == 0 {
				if _, err := b.(broker.Inspector).Stats(ctx, stream, group); err != nil && ctx.Err() == nil {
					t.Errorf("stats %s/%s: %v", stream, group, err)
				}
			}
			if remaining.Add(-1) == 0 {
				close(allSeen)
			}
		}
	}
	for s := range nStreams {
		for _, g := range groups {
			for range nConsumers {
				consumers.Add(1)
				go consume(fmt.Sprintf("s%d", s), g)
			}
		}
	}

	var publishers sync.WaitGroup
	for p := range nPublishers {
		publishers.Add(1)
		go func() {
			defer publishers.Done()
			for i := 0; i < perPublisher; {
				var batch []delivery.Message
				for n := 1 + (i+p)%3; n > 0 && i < perPublisher; n-- { // batches of 1 to 3, across streams
					batch = append(batch, msg(streamOf(p, i), fmt.Sprintf("p%d-%d", p, i)))
					i++
				}
				if err := b.Publish(ctx, batch...); err != nil {
					t.Errorf("publisher %d: %v", p, err)
					return
				}
			}
		}()
	}
	publishers.Wait()
	select {
	case <-allSeen:
	case <-time.After(3 * timeout):
		t.Errorf("timed out: %d of %d deliveries outstanding", remaining.Load(), total*nGroups)
	}
	cancel()
	consumers.Wait()
	if t.Failed() {
		return
	}

	var wrong []string
	for p := range nPublishers {
		for i := range perPublisher {
			for _, g := range groups {
				if n := seen[fmt.Sprintf("%s/p%d-%d", g, p, i)]; n != 1 {
					wrong = append(wrong, fmt.Sprintf("%s/p%d-%d x%d", g, p, i, n))
				}
			}
		}
	}
	slices.Sort(wrong)
	require.Empty(t, wrong[:min(len(wrong), 20)], "%d messages not delivered exactly once per group", len(wrong))
	for s := range nStreams {
		for _, g := range groups {
			e.empty(fmt.Sprintf("s%d", s), g)
			if hasStats {
				require.Equal(t, broker.Stats{}, e.stats(fmt.Sprintf("s%d", s), g))
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
