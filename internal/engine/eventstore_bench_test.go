package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	esub "github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/position"
)

// BenchmarkEventStoreSubscriptionWASM: OrderPlaced events per second
// through an event-store subscription on PostgreSQL into the example
// client_orders projector (WASM, deadline on; it loads and writes its
// client's document per event), with 16 clients, handled sequentially
// (key_workers = 1) and by per-key workers (2, 4) inside the one lease.
// Does per-key parallelism pay on this machine? Compare the rows.
func BenchmarkEventStoreSubscriptionWASM(b *testing.B) {
	const events, clients = 400, 16
	ctx := context.Background()
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b)})
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.Close(ctx) })
	set, errs := host.LoadSet(ctx, l, wasmbuild.Examples(b), host.Broker{Name: "default", Provider: "inline", Capabilities: broker.ReliableMessaging})
	require.Empty(b, errs)
	pool := testserver.PostgresPool(b)
	p := unitofwork.NewPostgres(pool)
	uow := unitofwork.New(p, unitofwork.Options{Broker: "default"})
	e := New(set, Options{Events: p.Events, Records: p.Records, EventStore: true, UnitOfWork: uow})
	b.Cleanup(func() { _ = e.Stop(ctx) })
	var batch []eventstore.NewEvent
	for i := range events {
		data, _ := json.Marshal(map[string]any{"order_id": fmt.Sprint("o-", i), "client_id": fmt.Sprint("c-", i%clients), "total": 1.5})
		batch = append(batch, eventstore.NewEvent{Stream: fmt.Sprint("order-o-", i), Type: "OrderPlaced", Data: data, ExpectedVersion: eventstore.AnyVersion})
	}
	_, err = p.Events.Append(ctx, batch)
	require.NoError(b, err)
	run := 0
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("key_workers=%d", workers), func(b *testing.B) {
			for b.Loop() {
				run++
				// A fresh projection per run: the group's documents are
				// new, so each run does the same work.
				group := "client_orders"
				_, err := pool.Exec(ctx, `DELETE FROM records WHERE kind = 'projection' AND type = 'client_orders'`)
				require.NoError(b, err)
				_, err = pool.Exec(ctx, `DELETE FROM consumer_positions WHERE consumer_group = $1`, group)
				require.NoError(b, err)
				h := &counting{Handler: e.Handler(), want: events, done: make(chan struct{})}
				c, err := esub.NewConsumer(esub.Options{
					Events: p.Events, Positions: p.Positions, Leases: esub.NewPostgresLeases(pool),
					Failures: esub.NewPostgresFailures(pool), Handler: h,
					Skip: func(ctx context.Context, f position.Fence) error { _, err := uow.CommitFenced(ctx, f); return err },
					Subscriptions: func() []esub.Subscription {
						return []esub.Subscription{{Group: group, Category: "order", Partitioned: true}}
					},
					Key: func(_ string, data json.RawMessage) string {
						var v struct {
							ClientID string `json:"client_id"`
						}
						_ = json.Unmarshal(data, &v)
						return v.ClientID
					},
					Classify: Classify, Owner: fmt.Sprint("bench-", run), BatchSize: 100, KeyWorkers: workers, Poll: time.Millisecond,
				})
				require.NoError(b, err)
				require.NoError(b, c.Start(ctx))
				select {
				case <-h.done:
				case <-time.After(5 * time.Minute):
					b.Fatalf("handled %d of %d", h.n.Load(), events)
				}
				require.NoError(b, c.Stop(ctx))
			}
			b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
