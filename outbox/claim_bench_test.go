package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
)

func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	if err := testserver.PostgresAvailable(); err != nil {
		b.Skipf("no PostgreSQL server: %v", err)
	}
	return testserver.PostgresPool(b)
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

// BenchmarkClaimPostgresHeld is the claim of a relay that comes while
// another relay holds the first rows of every key: 7,000 rows on 6 keys,
// as a broker outage leaves them, with relay a's claim of 50 rows taking
// each key's head. Relay b's claim finds nothing; it should cost about as
// much as a claim that finds its rows (productive, the baseline in the
// same run: a claim of 50 rows and their mark), not a walk of the
// backlog behind the held heads.
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
