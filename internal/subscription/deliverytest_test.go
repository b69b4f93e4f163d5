package subscription_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/delivery/deliverytest"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/position"
)

// The event-store subscriptions pass the delivery sources' conformance
// suite: a partitioned subscription is keyed and halts a key past its
// retries (its later messages are held), with per-key workers and
// sequentially; an unpartitioned one parks the message (a failure record)
// and goes on.
func TestDeliverytestMemory(t *testing.T) {
	t.Parallel()
	runDeliverytest(t, memoryHarness)
}

func TestDeliverytestPostgres(t *testing.T) {
	t.Parallel()
	runDeliverytest(t, postgresHarness)
}

func runDeliverytest(t *testing.T, newHarness func(t *testing.T) *harness) {
	for _, v := range []struct {
		name        string
		partitioned bool
		keyWorkers  int
		f           deliverytest.Features
	}{
		{"Partitioned", true, 2, deliverytest.Features{Keyed: true, Halt: true}},
		{"PartitionedSequential", true, 1, deliverytest.Features{Keyed: true, Halt: true}},
		{"Unpartitioned", false, 1, deliverytest.Features{Park: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			deliverytest.Run(t, v.f, func(t *testing.T) deliverytest.Harness {
				return &dtSource{h: newHarness(t), partitioned: v.partitioned, keyWorkers: v.keyWorkers}
			})
		})
	}
}

// dtSource is the subscription of the group "g" to the category "order"
// over one harness's stores. A message's key is its data's "key" field.
type dtSource struct {
	h           *harness
	partitioned bool
	keyWorkers  int

	mu     sync.Mutex
	starts int
}

const dtGroup, dtCategory = "g", "order"

// Publish appends each message to the stream order-{key} (order-x when
// unkeyed).
func (s *dtSource) Publish(ctx context.Context, msgs ...deliverytest.Message) ([]string, error) {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		key := m.Key
		if key == "" {
			key = "x"
		}
		evs, err := s.h.events.Append(ctx, []eventstore.NewEvent{{Stream: dtCategory + "-" + key, Type: m.Type, Data: m.Data, ExpectedVersion: eventstore.AnyVersion}})
		if err != nil {
			return nil, err
		}
		ids = append(ids, evs[0].ID)
	}
	return ids, nil
}

func (s *dtSource) Start(ctx context.Context, c deliverytest.Config) (func(context.Context) error, error) {
	s.mu.Lock()
	s.starts++
	owner := fmt.Sprintf("host-%d", s.starts)
	s.mu.Unlock()
	h := s.h
	subs := []subscription.Subscription{{Group: dtGroup, Category: dtCategory, Partitioned: s.partitioned, KeyField: "key"}}
	// A lease TTL far above the test: a restart takes the unit over only
	// because Stop released it.
	cons, err := subscription.NewConsumer(subscription.Options{
		Events: h.events, Positions: h.positions, Leases: h.leases, Failures: h.failures, Handler: c.Handler,
		Skip:          func(ctx context.Context, f position.Fence) error { _, err := h.uow.CommitFenced(ctx, f); return err },
		Subscriptions: func() []subscription.Subscription { return subs },
		Key: func(field string, data json.RawMessage) string {
			var v map[string]any
			_ = json.Unmarshal(data, &v)
			k, _ := v[field].(string)
			return k
		},
		Owner: owner, LeaseTTL: time.Hour, Heartbeat: 200 * time.Millisecond, Poll: 10 * time.Millisecond, BatchSize: 7,
		Retry: c.Policy, Classify: c.Classify, KeyWorkers: s.keyWorkers,
	})
	if err != nil {
		return nil, err
	}
	if err := cons.Start(ctx); err != nil {
		return nil, err
	}
	return cons.Stop, nil
}

// Commit commits the unit's (or key slot's) position, fenced by the
// generation, through the unit of work, as the engine commits effects
// with it.
func (s *dtSource) Commit(ctx context.Context, b delivery.Batch, n int) error {
	_, err := s.h.uow.CommitFenced(ctx, position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: b.Messages[n-1].GlobalPosition}})
	return err
}

// GivenUp returns the messages recorded as failed (not those held behind a
// failed key).
func (s *dtSource) GivenUp(ctx context.Context) ([]string, error) {
	fs, err := s.h.failures.List(ctx, dtGroup, dtCategory, false)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range fs {
		if f.Status == subscription.StatusFailed {
			out = append(out, f.MessageID)
		}
	}
	return out, nil
}
