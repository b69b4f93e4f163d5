package subscription_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

// noop is the trivial handler: it handles every message of a batch and
// commits the position alone (a handler whose effects are empty), one
// fenced unit of work per batch, as the engine does.
type noop struct {
	uow  *unitofwork.UnitOfWork
	done atomic.Int64
	all  chan struct{}
	want int64
}

func (n *noop) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	last := b.Messages[len(b.Messages)-1].GlobalPosition
	if _, err := n.uow.CommitFenced(ctx, position.Fence{Group: b.Group, Unit: b.Unit, Generation: b.Generation,
		Advance: map[string]int64{b.Source: last}}); err != nil {
		return 0, err
	}
	if n.done.Add(int64(len(b.Messages))) == n.want {
		close(n.all)
	}
	return len(b.Messages), nil
}

// BenchmarkPostgresSubscription: events per second through one
// event-store subscription on PostgreSQL with the trivial handler, beside
// a raw loop doing the same reads and position updates with plain SQL
// (SELECT a batch of the category by global position, UPDATE the
// position row), in the same run. Each iteration drains the same 5,000
// events as a new consumer group.
func BenchmarkPostgresSubscription(b *testing.B) {
	const events = 5000
	pool := testserver.PostgresPool(b)
	p := unitofwork.NewPostgres(pool)
	uow := unitofwork.New(p, unitofwork.Options{Broker: "default"})
	ctx := context.Background()
	for i := 0; i < events; i += 500 {
		var batch []eventstore.NewEvent
		for j := range 500 {
			data, _ := json.Marshal(map[string]any{"K": fmt.Sprint((i + j) % 64), "I": i + j})
			batch = append(batch, eventstore.NewEvent{Stream: fmt.Sprintf("order-%d", (i+j)%64), Type: "Happened", Data: data, ExpectedVersion: eventstore.AnyVersion})
		}
		if _, err := p.Events.Append(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	// -count runs each sub-benchmark again on the same database: fresh
	// group names every time (run), or a group would start at the end.
	// consume drains the category through one subscription sub, handling
	// batches of size with workers key workers (key: a partitioned one).
	consume := func(b *testing.B, sub subscription.Subscription, size, workers int, key func(string, json.RawMessage) string) {
		h := &noop{uow: uow, all: make(chan struct{}), want: events}
		c, err := subscription.NewConsumer(subscription.Options{
			Events: p.Events, Positions: p.Positions, Leases: subscription.NewPostgresLeases(pool),
			Failures: subscription.NewPostgresFailures(pool), Handler: h,
			Skip:          func(ctx context.Context, f position.Fence) error { _, err := uow.CommitFenced(ctx, f); return err },
			Subscriptions: func() []subscription.Subscription { return []subscription.Subscription{sub} },
			Key:           key,
			Owner:         "bench", BatchSize: size, KeyWorkers: workers, Poll: time.Millisecond,
		})
		drain(b, c, err, h)
	}
	keyOf := func(_ string, data json.RawMessage) string {
		var v struct{ K string }
		_ = json.Unmarshal(data, &v)
		return v.K
	}
	for _, workers := range []int{1, 2, 4} {
		// A partitioned subscription (64 keys) with per-key workers, batch 100.
		b.Run(fmt.Sprintf("batch=100/key_workers=%d", workers), func(b *testing.B) {
			run := eventstore.NewID()[:8]
			for i := 0; b.Loop(); i++ {
				consume(b, subscription.Subscription{Group: fmt.Sprintf("%s-k%d-%d", run, workers, i), Category: "order", Partitioned: true}, 100, workers, keyOf)
			}
			b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d/subscription", size), func(b *testing.B) {
			run := eventstore.NewID()[:8]
			for i := 0; b.Loop(); i++ {
				consume(b, subscription.Subscription{Group: fmt.Sprintf("%s-s%d-%d", run, size, i), Category: "order"}, size, 0, nil)
			}
			b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
		})
		b.Run(fmt.Sprintf("batch=%d/raw", size), func(b *testing.B) {
			run := eventstore.NewID()[:8]
			for i := 0; b.Loop(); i++ {
				rawDrain(b, pool, fmt.Sprintf("%s-r%d-%d", run, size, i), size, events)
			}
			b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// drain runs c until h has handled every event, then stops it.
func drain(b *testing.B, c *subscription.Consumer, err error, h *noop) {
	ctx := context.Background()
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-h.all
	if err := c.Stop(ctx); err != nil {
		b.Fatal(err)
	}
}

// rawDrain reads the category in batches by global position and, per
// batch, updates a position row in its own transaction: the least a
// durable consumer does.
func rawDrain(b *testing.B, pool *pgxpool.Pool, group string, size, events int) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_positions (consumer_group, unit, generation, updated_at) VALUES ($1, 'order', 1, now())`, group); err != nil {
		b.Fatal(err)
	}
	var pos int64
	n := 0
	for n < events {
		rows, err := pool.Query(ctx, `SELECT id, stream_name, type, position, global_position, time, data, metadata FROM message_store.messages
			WHERE message_store.category(stream_name) = 'order' AND global_position > $1 ORDER BY global_position LIMIT $2`, pos, size)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var id, stream, typ string
			var p, gp int64
			var at time.Time
			var data, md []byte
			if err := rows.Scan(&id, &stream, &typ, &p, &gp, &at, &data, &md); err != nil {
				b.Fatal(err)
			}
			pos = gp
			n++
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE consumer_positions SET positions = jsonb_build_object('order', $2::bigint), updated_at = now()
			WHERE consumer_group = $1 AND unit = 'order' AND generation = 1`, group, pos); err != nil {
			b.Fatal(err)
		}
	}
}
