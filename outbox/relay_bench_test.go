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
// they measure the relay's own cost: claim, publish call, mark. The
// PostgreSQL ones run beside their baseline, rawDrain, which moves the same
// rows to published with the least SQL that can (one UPDATE … FOR UPDATE
// SKIP LOCKED per 50 rows), on the same server in the same run.

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

// BenchmarkRelayPostgres drains a backlog of 5,000 and of 20,000 rows (one
// key each), each beside its baseline in the same run: raw, the least SQL
// that claims and marks (one UPDATE … FOR UPDATE SKIP LOCKED per 50 rows,
// no per-key order, no lease). The relay's claim walks the active-row
// index to its limit, so its rate should not fall with the backlog.
func BenchmarkRelayPostgres(b *testing.B) {
	pool := benchPool(b)
	s := outbox.NewPostgres(pool, nil)
	ctx := context.Background()
	for _, n := range []int{5000, 20000} {
		refill := func(b *testing.B) {
			b.StopTimer()
			if _, err := pool.Exec(ctx, `TRUNCATE outbox`); err != nil {
				b.Fatal(err)
			}
			fill(b, s, n, false)
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.Run(fmt.Sprintf("backlog=%d/relay", n), func(b *testing.B) {
			r := outbox.NewRelay(s, outbox.RelayOptions{Broker: "default", Owner: "bench", Publisher: noopBroker{}, BatchSize: 50})
			for b.Loop() {
				refill(b)
				drain(b, r, n)
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
		b.Run(fmt.Sprintf("backlog=%d/raw", n), func(b *testing.B) {
			for b.Loop() {
				refill(b)
				rawDrain(b, pool, n)
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkRelayPostgresOneKey is the worst case of per-key order: every
// row on one key, so each claim can hand out only that key's head row.
func BenchmarkRelayPostgresOneKey(b *testing.B) {
	benchRelay(b, outbox.NewPostgres(benchPool(b), nil), true)
}

// rawDrain moves n pending rows to published with the least SQL that can.
func rawDrain(b *testing.B, pool *pgxpool.Pool, n int) {
	b.Helper()
	ctx := context.Background()
	for done := 0; done < n; {
		tag, err := pool.Exec(ctx, `UPDATE outbox SET status = 'published', published_at = now()
			WHERE id IN (SELECT id FROM outbox WHERE target_broker = 'default' AND status = 'pending'
				ORDER BY priority DESC, id LIMIT 50 FOR UPDATE SKIP LOCKED)`)
		if err != nil {
			b.Fatal(err)
		}
		if tag.RowsAffected() == 0 {
			b.Fatalf("drained %d of %d rows", done, n)
		}
		done += int(tag.RowsAffected())
	}
}
