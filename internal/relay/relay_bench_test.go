package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
)

// The relay benchmarks drain b.N rows to a broker that does nothing, so
// they measure the relay's own cost: claim, publish call, mark. The
// PostgreSQL ones run beside their baseline, rawDrain, which moves the same
// rows to published with the least SQL that can (one UPDATE … FOR UPDATE
// SKIP LOCKED per 50 rows), on the same server in the same run.

type noopBroker struct{}

func (noopBroker) Publish(context.Context, ...delivery.Message) error { return nil }
func (noopBroker) Capabilities() broker.Capability                    { return 0 }

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

func drain(b *testing.B, r *relay.Relay, n int) {
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
	r := relay.New(s, relay.Options{Broker: "default", Owner: "bench", Publisher: noopBroker{}, BatchSize: 50})
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
			r := relay.New(s, relay.Options{Broker: "default", Owner: "bench", Publisher: noopBroker{}, BatchSize: 50})
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

type partitioningNoop struct{ noopBroker }

func (partitioningNoop) Capabilities() broker.Capability { return broker.StreamPartitioning }

// unchained hides the store's Chainer, as the relay before the per-key
// check was: no prev per message.
type unchained struct{ outbox.RelayStore }

// benchRaw is the raw drain's sub-benchmark: refill, then rawDrain n rows.
func benchRaw(b *testing.B, pool *pgxpool.Pool, n int, refill func(*testing.B)) {
	for b.Loop() {
		refill(b)
		rawDrain(b, pool, n)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
}

// refillKeyed empties the outbox and adds n rows over keys partition
// keys, each with its global position, then vacuums and analyzes the
// table, with the benchmark's timer stopped.
func refillKeyed(b *testing.B, pool *pgxpool.Pool, s *outbox.Postgres, n, keys int) {
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `TRUNCATE outbox`); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; {
		var rows []outbox.Row
		for j := 0; j < 500 && i < n; j, i = j+1, i+1 {
			key := fmt.Sprintf("c-%d", i%keys)
			rows = append(rows, outbox.Row{MessageID: eventstore.NewID(), Stream: fmt.Sprintf("order-%d", i), Type: "OrderPlaced",
				Data: json.RawMessage(`{"order_id":"o","client_id":"c","total":1}`), TargetBroker: "default", PartitionKey: &key,
				Metadata: json.RawMessage(fmt.Sprintf(`{"position": 0, "global_position": %d}`, i+1))})
		}
		if err := s.Add(ctx, rows); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRelayPostgresPartitioned is the cost of the per-key check on
// the relay: 5,000 rows over 64 partition keys to a partitioning broker
// that does nothing, with each message's prev read from the published rows
// (one statement per pass, on outbox_published_key) against the relay
// before the check (no Chainer, and the index dropped, as before migration
// 0011), beside the raw drain, in the same run.
func BenchmarkRelayPostgresPartitioned(b *testing.B) {
	pool := benchPool(b)
	s := outbox.NewPostgres(pool, nil)
	ctx := context.Background()
	const n, keys = 5000, 64
	refill := func(b *testing.B) { refillKeyed(b, pool, s, n, keys) }
	index := func(b *testing.B, on bool) {
		sql := `DROP INDEX IF EXISTS outbox_published_key`
		if on {
			sql = `CREATE INDEX IF NOT EXISTS outbox_published_key ON outbox (target_broker, category, ordering_key, id) WHERE status = 'published'`
		}
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	for _, v := range []struct {
		name  string
		store outbox.RelayStore
		index bool
	}{{"checked", s, true}, {"index-only", unchained{s}, true}, {"unchecked", unchained{s}, false}} {
		b.Run(v.name, func(b *testing.B) {
			index(b, v.index)
			defer index(b, true)
			r := relay.New(v.store, relay.Options{Broker: "default", Owner: "bench", Publisher: partitioningNoop{}, BatchSize: 50})
			for b.Loop() {
				refill(b)
				drain(b, r, n)
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
	b.Run("raw", func(b *testing.B) { benchRaw(b, pool, n, refill) })
}

// BenchmarkRelayPostgresContended drains a backlog of 5,000 rows on 6
// partition keys (a few hot keys, as a broker outage leaves them) with one
// and with three relays running their own loops (Start) against one
// database, beside the raw drain, in the same run. Each claim takes the
// heads of every key, so the other relays' claims mostly find nothing;
// several relays should drain a backlog at least as fast as one.
func BenchmarkRelayPostgresContended(b *testing.B) {
	pool := benchPool(b)
	s := outbox.NewPostgres(pool, nil)
	ctx := context.Background()
	const n, keys = 5000, 6
	refill := func(b *testing.B) { refillKeyed(b, pool, s, n, keys) }
	for _, relays := range []int{1, 3} {
		b.Run(fmt.Sprintf("relays=%d", relays), func(b *testing.B) {
			for b.Loop() {
				refill(b)
				var rs []*relay.Relay
				for i := range relays {
					r := relay.New(s, relay.Options{Broker: "default", Owner: fmt.Sprintf("bench-%d", i),
						Publisher: partitioningNoop{}, BatchSize: 50, Tick: 10 * time.Millisecond, Jitter: 0.5})
					if err := r.Start(ctx); err != nil {
						b.Fatal(err)
					}
					rs = append(rs, r)
				}
				// A bound far past any drain, so that a relay that stops
				// publishing fails the benchmark instead of hanging it.
				deadline := time.Now().Add(5 * time.Minute)
				for left := n; ; time.Sleep(5 * time.Millisecond) {
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status <> 'published'`).Scan(&left); err != nil {
						b.Fatal(err)
					}
					if left == 0 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("%d relays: %d of %d rows still unpublished", relays, left, n)
					}
				}
				for _, r := range rs {
					if err := r.Stop(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
		})
	}
	b.Run("raw", func(b *testing.B) { benchRaw(b, pool, n, refill) })
}

// BenchmarkClaimPostgresHeld is the claim of a relay that comes while
// another relay holds the first rows of every key: 7,000 rows on 6 keys,
// as a broker outage leaves them, with relay a's claim of 50 rows taking
// each key's head. Relay b's claim finds nothing; it should cost about as
// much as a claim that finds its rows (productive, the baseline in the
// same run: a claim of 50 rows and their mark), not a walk of the
// backlog behind the held heads. It measures the store (outbox.Postgres),
// beside the relay benchmarks whose backlog helper it shares.
func BenchmarkClaimPostgresHeld(b *testing.B) {
	pool := benchPool(b)
	s := outbox.NewPostgres(pool, nil)
	ctx := context.Background()
	const n, keys = 7000, 6
	claim := func(b *testing.B, owner string) []outbox.Row {
		rows, err := s.ClaimChained(ctx, "default", owner, 50, time.Hour, outbox.Lanes{})
		if err != nil {
			b.Fatal(err)
		}
		return rows
	}
	b.Run("held", func(b *testing.B) {
		refillKeyed(b, pool, s, n, keys)
		if got := len(claim(b, "a")); got != 50 {
			b.Fatalf("relay a claimed %d rows", got)
		}
		for b.Loop() {
			if got := len(claim(b, "b")); got != 0 {
				b.Fatalf("relay b claimed %d rows behind a's", got)
			}
		}
	})
	b.Run("productive", func(b *testing.B) {
		refillKeyed(b, pool, s, n, keys)
		for b.Loop() {
			rows := claim(b, "b")
			if len(rows) < 50 { // drained: a fresh backlog, off the clock
				refillKeyed(b, pool, s, n, keys)
				rows = claim(b, "b")
			}
			if len(rows) != 50 {
				b.Fatalf("claimed %d rows", len(rows))
			}
			ids := make([]int64, len(rows))
			for i := range rows {
				ids[i] = rows[i].ID
			}
			if err := s.MarkPublishedBatch(ctx, "b", ids); err != nil {
				b.Fatal(err)
			}
		}
	})
}
