package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	esub "github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// pauses records the waits a path asks its clock for; only those the
// policy could have asked for (not polls or heartbeats) count.
type pauses struct {
	mu   sync.Mutex
	want map[time.Duration]bool
	got  []time.Duration
	// virtual is a clock that moves only by the waits asked of it (now),
	// for a broker that computes its waits from its clock.
	virtual bool
	now     time.Time
}

func (p *pauses) after(d time.Duration) <-chan time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.want[d] {
		p.got = append(p.got, d)
	}
	if !p.virtual {
		return time.After(d)
	}
	p.now = p.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- p.now
	return ch
}

func (p *pauses) clock() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.now
}

func (p *pauses) list() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// One retry policy on the three delivery paths: with the same max_retries
// and delays, a message that always fails on its own is tried 1 +
// max_retries times on each (max_retries counts retries after the first
// attempt; the Redis partition workers counted total attempts before), with
// the same pauses between its attempts (the delay doubling up to its cap;
// the partition workers waited a fixed delay, the others doubled without a
// cap), and then given up the path's way: dead-lettered, halted, recorded
// as failed.
func TestOneRetryPolicyOnEveryPath(t *testing.T) {
	pol := delivery.Policy{MaxRetries: 3, Delay: 7 * time.Millisecond, MaxDelay: 20 * time.Millisecond}
	want := []time.Duration{7 * time.Millisecond, 14 * time.Millisecond, 20 * time.Millisecond}
	for _, path := range []struct {
		name string
		run  func(t *testing.T, pol delivery.Policy, p *pauses, op string) (attempts int, gaveUp string)
	}{
		{"broker consumer group (inline)", runInlineRetries},
		{"redis partition worker", runPartitionRetries},
		{"event-store subscription", runSubscriptionRetries},
	} {
		t.Run(path.name, func(t *testing.T) {
			p := &pauses{want: map[time.Duration]bool{}}
			for n := 1; n <= pol.MaxRetries+1; n++ {
				p.want[pol.Pause(n)] = true
			}
			attempts, gaveUp := path.run(t, pol, p, "transient")
			require.Equal(t, 1+pol.MaxRetries, attempts, "the first attempt and max_retries retries")
			require.Equal(t, want, p.list(), "the pauses before each retry")
			require.NotEmpty(t, gaveUp)
		})
	}
}

// A message whose failure is permanent (the guest says a retry cannot
// help) is given up after its first attempt on every path, without a
// pause: rejected into the dead letters (broker.Rejecter; the brokers
// used to retry it max_retries times), halted, recorded as failed.
func TestPermanentFailureIsGivenUpAtOnceOnEveryPath(t *testing.T) {
	pol := delivery.Policy{MaxRetries: 3, Delay: 7 * time.Millisecond, MaxDelay: 20 * time.Millisecond}
	for _, path := range []struct {
		name string
		run  func(t *testing.T, pol delivery.Policy, p *pauses, op string) (attempts int, gaveUp string)
		want string
	}{
		{"broker consumer group (inline)", runInlineRetries, "dead-lettered (rejected) at attempt 1"},
		{"redis partition worker", runPartitionRetries, "halted after 1 attempts"},
		{"event-store subscription", runSubscriptionRetries, "recorded failed after 1 attempts"},
	} {
		t.Run(path.name, func(t *testing.T) {
			p := &pauses{want: map[time.Duration]bool{}}
			for n := 1; n <= pol.MaxRetries+1; n++ {
				p.want[pol.Pause(n)] = true
			}
			attempts, gaveUp := path.run(t, pol, p, "rejected")
			require.Equal(t, 1, attempts, "the first attempt only")
			require.Empty(t, p.list(), "no pause before giving up")
			require.Equal(t, path.want, gaveUp)
		})
	}
}

// attemptsOf counts the failed attempts the engine saw of message id.
func attemptsOf(e *Engine) func() int {
	var mu sync.Mutex
	n := 0
	e.opts.Handled = func(h Handled) {
		if h.Err != nil {
			mu.Lock()
			n++
			mu.Unlock()
		}
	}
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func runInlineRetries(t *testing.T, pol delivery.Policy, p *pauses, op string) (int, string) {
	e, _ := partitionEngine(t)
	attempts := attemptsOf(e)
	p.virtual, p.now = true, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	src := startInline(t, e, broker.Options{Policy: delivery.Policy{MaxRetries: pol.MaxRetries, Delay: pol.Delay, MaxDelay: pol.MaxDelay},
		MessageTimeout: time.Minute, EnableDLQ: true, Clock: clock.Funcs{NowFunc: p.clock, AfterFunc: p.after}}, op)
	var dead string
	testwait.For(t, "the message dead-lettered", func() (bool, string) {
		dl, err := src.DLQ(context.Background(), "ops", "behave")
		require.NoError(t, err)
		if len(dl) == 0 {
			return false, "no dead letter"
		}
		dead = fmt.Sprintf("dead-lettered (%s) at attempt %d", dl[0].Reason, dl[0].Attempts)
		return true, ""
	})
	return attempts(), dead
}

func runPartitionRetries(t *testing.T, pol delivery.Policy, p *pauses, op string) (int, string) {
	e, mem := partitionEngine(t)
	attempts := attemptsOf(e)
	url, prefix := testserver.Redis(t)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	m := opBatch(1, op).Messages[0]
	m.Category, m.PartitionKey = "ops", "u"
	ctx := context.Background()
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + partition.StreamName("ops", "u"), Values: redisstream.Encode(m)}).Err())
	require.NoError(t, rdb.SAdd(ctx, prefix+redispartition.IndexKey("ops"), "u").Err())
	c, err := redispartition.NewConsumer(redispartition.ConsumerOptions{
		Leases: redispartition.NewLeases(rdb, prefix), Positions: mem.Positions, Handler: e.Handler(), Decode: redisstream.Decode,
		Owner: "policy", Subscriptions: func() []partition.Subscription {
			return []partition.Subscription{{Group: "behave", Categories: []string{"ops"}}}
		},
		LeaseTTL: time.Minute, Heartbeat: time.Second, Poll: 5 * time.Millisecond, ReapIdle: time.Hour,
		Retry: pol, Classify: Classify, Clock: clock.Funcs{AfterFunc: p.after},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	var halted string
	testwait.For(t, "the partition halted", func() (bool, string) {
		h, err := rdb.HGetAll(ctx, prefix+redispartition.HaltKey("behave", partition.PartitionUnit("ops", "u"))).Result()
		require.NoError(t, err)
		if len(h) == 0 {
			return false, "not halted"
		}
		halted = "halted after " + h["attempts"] + " attempts"
		return true, ""
	})
	return attempts(), halted
}

func runSubscriptionRetries(t *testing.T, pol delivery.Policy, p *pauses, op string) (int, string) {
	e, mem := partitionEngine(t)
	attempts := attemptsOf(e)
	ctx := context.Background()
	m := opBatch(1, op).Messages[0]
	_, err := mem.Events.Append(ctx, []eventstore.NewEvent{{Stream: "ops-1", Type: m.Type, Data: m.Data, ExpectedVersion: eventstore.AnyVersion}})
	require.NoError(t, err)
	failures := &esub.MemoryFailures{Positions: mem.Positions}
	uow := unitofwork.New(mem, unitofwork.Options{Broker: "default"})
	c, err := esub.NewConsumer(esub.Options{
		Events: mem.Events, Positions: mem.Positions, Leases: &esub.MemoryLeases{}, Failures: failures, Handler: e.Handler(),
		Skip:          func(ctx context.Context, f position.Fence) error { _, err := uow.CommitFenced(ctx, f); return err },
		Subscriptions: func() []esub.Subscription { return []esub.Subscription{{Group: "behave", Category: "ops"}} },
		Key:           func(string, json.RawMessage) string { return "" },
		Classify:      Classify, Owner: "policy", Poll: 5 * time.Millisecond, Retry: pol, Clock: clock.Funcs{AfterFunc: p.after},
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	var recorded string
	testwait.For(t, "the message recorded as failed", func() (bool, string) {
		fs, err := failures.List(ctx, "behave", "ops", true)
		require.NoError(t, err)
		if len(fs) == 0 {
			return false, "no record"
		}
		recorded = fmt.Sprintf("recorded %s after %d attempts", fs[0].Status, fs[0].Attempts)
		return true, ""
	})
	return attempts(), recorded
}
