package record_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/record"
)

// BenchmarkQueueWrite is a grouped transaction's record writes as a
// loaded host's partition workers make them, on a table of 50,000 other
// records: n runs of different keys,
// each updating its key's projection document (about 1.5 KB, a client's
// last 50 orders), in one pipelined transaction (BEGIN, the writes,
// COMMIT; one round trip). each queues them one statement a write
// (QueueWrite once per write: the baseline, first, in the same run), all
// as QueueWrite queues a group's writes, one statement for all of them.
// Reported per write.
func BenchmarkQueueWrite(b *testing.B) {
	if err := testserver.PostgresAvailable(); err != nil {
		b.Skipf("no PostgreSQL server: %v", err)
	}
	pool := testserver.PostgresPool(b)
	ctx := context.Background()
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("o-%08d", i)
	}
	data, _ := json.Marshal(map[string]any{"client_id": "c", "orders": 50, "order_ids": ids})
	if _, err := pool.Exec(ctx, `INSERT INTO records (kind, type, id, version, data) SELECT 'projection', 'filler', 'f-' || g, 1, $1 FROM generate_series(1, 50000) g`, string(data)); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE records`); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{4, 16} {
		for _, mode := range []string{"each", "all"} {
			b.Run(fmt.Sprintf("n=%d/%s", n, mode), func(b *testing.B) {
				writes := make([]record.Write, n)
				for i := range writes {
					writes[i] = record.Write{Key: record.Key{Kind: "projection", Type: "client_orders", ID: fmt.Sprintf("%d-%s-%02d", n, mode, i)}, Data: data}
				}
				for b.Loop() {
					batch := &pgx.Batch{}
					batch.Queue(`BEGIN`)
					var readers []func(pgx.BatchResults) error
					queue := func(w ...record.Write) {
						r, err := record.QueueWrite(batch, w)
						if err != nil {
							b.Fatal(err)
						}
						readers = append(readers, r)
					}
					if mode == "each" {
						for _, w := range writes {
							queue(w)
						}
					} else {
						queue(writes...)
					}
					batch.Queue(`COMMIT`)
					br := pool.SendBatch(ctx, batch)
					if _, err := br.Exec(); err != nil {
						b.Fatal(err)
					}
					for _, r := range readers {
						if err := r(br); err != nil {
							b.Fatal(err)
						}
					}
					if err := br.Close(); err != nil {
						b.Fatal(err)
					}
					for i := range writes {
						writes[i].ExpectedVersion++
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/write")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
