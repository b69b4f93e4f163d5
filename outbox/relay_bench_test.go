package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
)

// The relay benchmarks drain b.N rows to a broker that does nothing, so
// they measure the relay's own cost: claim, publish call, mark. Their
// baseline, BenchmarkRawDrainPostgres, moves the same rows to published
// with the least SQL that can (one UPDATE … FOR UPDATE SKIP LOCKED per 50
// rows), on the same server in the same run.

type noopBroker struct{}

func (noopBroker) Publish(context.Context, ...broker.Message) error { return nil }
func (noopBroker) Capabilities() broker.Capability                  { return 0 }

type adder interface {
	Add(ctx context.Context, rows []outbox.Row) error
}

// fill adds n rows, in batches, each on its own stream (keys distinct) or
// all on one stream (one key: rows go out one per claim).
func fill(b *testing.B, s adder, n int, oneKey bool) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; {
		var rows []outbox.Row
		for j := 0; j < 500 && i < n; j, i = j+1, i+1 {
			stream := fmt.Sprintf("order-%d", i)
			if oneKey {
				stream = "order-hot"
			}
			rows = append(rows, outbox.Row{MessageID: eventstore.NewID(), Stream: stream, Type: "OrderPlaced",
				Data: json.RawMessage(`{"order_id":"o","client_id":"c","total":1}`), TargetBroker: "default"})
		}
		if err := s.Add(ctx, rows); err != nil {
			b.Fatal(err)
		}
	}
}

func drain(b *testing.B, r *outbox.Relay, n int) {
	b.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		k, err := r.RunOnce(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if k == 0 {
			b.Fatalf("drained %d of %d rows", done, n)
		}
		done += k
	}
}

func benchRelay(b *testing.B, s interface {
	adder
	outbox.RelayStore
}, oneKey bool) {
	fill(b, s, b.N, oneKey)
	r := outbox.NewRelay(s, outbox.RelayOptions{Broker: "default", Owner: "bench", Publisher: noopBroker{}, BatchSize: 50})
	b.ResetTimer()
	drain(b, r, b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

func BenchmarkRelayMemory(b *testing.B) { benchRelay(b, outbox.NewMemory(nil), false) }

func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	if err := testserver.PostgresAvailable(); err != nil {
		b.Skipf("no PostgreSQL server: %v", err)
	}
	return testserver.PostgresPool(b)
}

func BenchmarkRelayPostgres(b *testing.B) {
	benchRelay(b, outbox.NewPostgres(benchPool(b), nil), false)
}

// BenchmarkRelayPostgresOneKey is the worst case of per-key order: every
// row on one key, so each claim can hand out only that key's head row.
func BenchmarkRelayPostgresOneKey(b *testing.B) {
	benchRelay(b, outbox.NewPostgres(benchPool(b), nil), true)
}

func BenchmarkRawDrainPostgres(b *testing.B) {
	pool := benchPool(b)
	fill(b, outbox.NewPostgres(pool, nil), b.N, false)
	ctx := context.Background()
	b.ResetTimer()
	for done := 0; done < b.N; {
		tag, err := pool.Exec(ctx, `UPDATE outbox SET status = 'published', published_at = now()
			WHERE id IN (SELECT id FROM outbox WHERE status = 'pending' ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)`)
		if err != nil {
			b.Fatal(err)
		}
		if tag.RowsAffected() == 0 {
			b.Fatalf("drained %d of %d rows", done, b.N)
		}
		done += int(tag.RowsAffected())
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
