package redispartition_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/delivery/deliverytest"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// The partition workers pass the delivery sources' conformance suite:
// keyed (a partition key per message, each key a unit) and halting (a
// message past its retries halts its key).
func TestDeliverytest(t *testing.T) {
	t.Parallel()
	deliverytest.Run(t, deliverytest.Features{Keyed: true, Halt: true}, func(t *testing.T) deliverytest.Harness {
		ls, rdb, prefix := newLeases(t)
		return &dtHarness{rdb: rdb, prefix: prefix, leases: ls, store: position.NewMemory(nil), last: map[string]int64{}, keys: map[string]bool{}}
	})
}

// dtHarness is the partition workers of one Redis key prefix, reading the
// category "order" for the group "proj", over a memory positions store.
type dtHarness struct {
	rdb    *redis.Client
	prefix string
	leases *redispartition.Leases
	store  *position.Memory

	mu     sync.Mutex
	gp     int64
	last   map[string]int64 // stream -> its last message's global position (the next one's prev)
	keys   map[string]bool
	starts int
}

const dtGroup, dtCategory = "proj", "order"

// Publish appends each message to its partition stream, registers the key
// in the category's index and wakes the consumers, as the Redis broker
// publishes a partitioned message.
func (h *dtHarness) Publish(ctx context.Context, msgs ...deliverytest.Message) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if m.Key == "" {
			return nil, fmt.Errorf("partition workers deliver keyed messages only")
		}
		h.gp++
		stream := partition.StreamName(dtCategory, m.Key)
		prev := h.last[stream]
		h.last[stream] = h.gp
		h.keys[m.Key] = true
		msg := delivery.Message{ID: fmt.Sprintf("m-%d", h.gp), Type: m.Type, Category: dtCategory, EventStream: dtCategory + "-" + m.Key,
			Data: m.Data, GlobalPosition: h.gp, PartitionKey: m.Key, Prev: prev}
		if err := h.rdb.XAdd(ctx, &redis.XAddArgs{Stream: h.prefix + stream, Values: redisstream.Encode(msg)}).Err(); err != nil {
			return nil, err
		}
		if err := h.rdb.SAdd(ctx, h.prefix+redispartition.IndexKey(dtCategory), m.Key).Err(); err != nil {
			return nil, err
		}
		if err := h.rdb.XAdd(ctx, &redis.XAddArgs{Stream: h.prefix + redispartition.WakeKey(dtCategory), Values: []any{m.Key, "1"}}).Err(); err != nil {
			return nil, err
		}
		ids = append(ids, msg.ID)
	}
	return ids, nil
}

func (h *dtHarness) Start(ctx context.Context, c deliverytest.Config) (func(context.Context) error, error) {
	h.mu.Lock()
	h.starts++
	owner := fmt.Sprintf("host-%d", h.starts)
	h.mu.Unlock()
	// A lease TTL far above the test: a restart takes the units over only
	// because Stop released them.
	cons, err := redispartition.NewConsumer(redispartition.ConsumerOptions{
		Leases: h.leases, Positions: h.store, Handler: c.Handler, Decode: redisstream.Decode, Owner: owner,
		Subscriptions: func() []partition.Subscription {
			return []partition.Subscription{{Group: dtGroup, Categories: []string{dtCategory}}}
		},
		LeaseTTL: time.Hour, Heartbeat: 100 * time.Millisecond, Poll: 5 * time.Millisecond, ReapIdle: time.Hour,
		Retry: c.Policy, Classify: c.Classify, BatchSize: 8,
	})
	if err != nil {
		return nil, err
	}
	if err := cons.Start(ctx); err != nil {
		return nil, err
	}
	return cons.Stop, nil
}

// Commit advances the unit's position, fenced by its generation, in one
// memory transaction, as the engine commits effects with it.
func (h *dtHarness) Commit(ctx context.Context, b delivery.Batch, n int) error {
	tx := h.store.Begin()
	defer tx.Rollback()
	fence := position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: b.Messages[n-1].GlobalPosition}}
	if err := tx.Advance(ctx, fence); err != nil {
		return err
	}
	return tx.Commit()
}

// GivenUp returns the messages that halted their keys (the halt records).
func (h *dtHarness) GivenUp(ctx context.Context) ([]string, error) {
	h.mu.Lock()
	var keys []string
	for k := range h.keys {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	var out []string
	for _, k := range keys {
		halt, err := h.rdb.HGetAll(ctx, h.prefix+redispartition.HaltKey(dtGroup, partition.PartitionUnit(dtCategory, k))).Result()
		if err != nil {
			return nil, err
		}
		if id := halt["message_id"]; id != "" {
			out = append(out, id)
		}
	}
	return out, nil
}
