package unitofwork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// BenchmarkUnitOfWork compares on one database in one run:
//   - raw: BEGIN, one single-row INSERT, COMMIT (three round trips): the
//     floor a unit of work is measured against;
//   - commit: UnitOfWork.Commit of one handled message (a record write, an
//     event, its outbox row), pipelined in one round trip;
//   - stepwise: the same through the Tx steps, one round trip each (BEGIN,
//     write, append, outbox, COMMIT), as the unit of work once did;
//   - run=N: CommitRun of N such messages, each atomic, in one transaction
//     and one round trip (group commit), reported per message (ns/msg,
//     msgs/s).
//
// Compare msgs/s: commit against raw is the unit of work's ratio; run=N
// against raw is group commit's.
// benchDatabase returns a pool on a fresh, migrated database, or skips
// when no PostgreSQL server can be had.
func benchDatabase(b *testing.B) *pgxpool.Pool {
	b.Helper()
	if err := testserver.PostgresAvailable(); err != nil {
		b.Skipf("no PostgreSQL server: %v", err)
	}
	return testserver.PostgresPool(b)
}

func BenchmarkUnitOfWork(b *testing.B) {
	pool := benchDatabase(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, k text NOT NULL, data jsonb)`); err != nil {
		b.Fatal(err)
	}
	perMsg := func(b *testing.B, msgs int) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*msgs), "ns/msg")
		b.ReportMetric(float64(b.N*msgs)/b.Elapsed().Seconds(), "msgs/s")
	}
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO bench_raw (k, data) VALUES ($1, $2)`, fmt.Sprintf("raw-%d", i), `{"status":"placed"}`); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		perMsg(b, 1)
	})
	u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3})
	b.Run("commit", func(b *testing.B) {
		run := eventstore.NewID()[:8] // fresh keys and streams per run
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := u.Commit(ctx, unitofwork.Change{Effects: placeOrder(fmt.Sprintf("%sc%d", run, i), `"c-1"`)}); err != nil {
				b.Fatal(err)
			}
		}
		perMsg(b, 1)
	})
	b.Run("stepwise", func(b *testing.B) {
		backend := unitofwork.NewPostgres(pool)
		run := eventstore.NewID()[:8]
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			stepwise(b, backend, fmt.Sprintf("%ss%d", run, i))
		}
		perMsg(b, 1)
	})
	for _, n := range []int{10, 50} {
		b.Run(fmt.Sprintf("run=%d", n), func(b *testing.B) {
			run := eventstore.NewID()[:8]
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				steps := make([]unitofwork.Step, n)
				for j := range steps {
					steps[j] = unitofwork.Step{Changes: []unitofwork.Change{{Effects: placeOrder(fmt.Sprintf("%sr%d-%d", run, i, j), `"c-1"`)}}}
				}
				if out, err := u.CommitRun(ctx, steps); err != nil || len(out) != n {
					b.Fatal(err)
				}
			}
			perMsg(b, n)
		})
	}
}

// stepwise commits one message through the Tx steps.
func stepwise(b *testing.B, backend *unitofwork.Postgres, id string) {
	ctx := context.Background()
	tx, err := backend.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	err = tx.Write(ctx, []record.Write{{Key: record.Key{Kind: record.KindAggregate, Type: "order", ID: id}, Data: json.RawMessage(`{"status":"placed"}`)}})
	if err != nil {
		b.Fatal(err)
	}
	evs, err := tx.Append(ctx, []eventstore.NewEvent{{Stream: "order-" + id, Type: "OrderPlaced", Data: json.RawMessage(`{"order_id":"x"}`), ExpectedVersion: eventstore.NoStream}})
	if err != nil {
		b.Fatal(err)
	}
	key := "client-" + id
	err = tx.Add(ctx, []outbox.Row{{MessageID: evs[0].ID, Stream: "order-" + id, Type: "OrderPlaced", Data: evs[0].Data, PartitionKey: &key, TargetBroker: "default"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCommitFenced compares, on one database in one run, a plain
// UnitOfWork.Commit of one handled message (a record write, an event, its
// outbox row) with CommitFenced of the same change (one more statement:
// the fence's UPDATE), and a fence-only commit (a handler that wrote
// nothing: BEGIN, the UPDATE, COMMIT).
func BenchmarkCommitFenced(b *testing.B) {
	pool := benchDatabase(b)
	u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3})
	positions := unitofwork.NewPostgres(pool).Positions
	ctx := context.Background()
	change := func(id string) unitofwork.Change {
		return unitofwork.Change{Effects: placeOrder(id, `"c-1"`)}
	}
	// -count runs each sub-benchmark again on the same database: fresh
	// records, streams and units every time.
	b.Run("plain", func(b *testing.B) {
		run := eventstore.NewID()[:8]
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := u.Commit(ctx, change(fmt.Sprintf("%sp%d", run, i))); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, mode := range []string{"fenced", "fence-only"} {
		b.Run(mode, func(b *testing.B) {
			run := eventstore.NewID()[:8]
			unit := run + ":" + mode
			row, err := positions.Claim(ctx, "bench", unit)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				f := position.Fence{Group: "bench", Unit: unit, Generation: row.Generation, Advance: map[string]int64{"order:c-1": int64(i + 1)}}
				var changes []unitofwork.Change
				if mode == "fenced" {
					changes = append(changes, change(fmt.Sprintf("%s%s%d", run, mode, i)))
				}
				if _, err := u.CommitFenced(ctx, f, changes...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkProjectionRun is a partition worker's run as the chaos load
// makes it: runs of 32 messages that each update one client's projection
// (a JSON document of about 20 KB, the client's orders) with their fence,
// committed by CommitRun, beside its floor in the same run: raw, the least
// SQL such a run needs (BEGIN, one UPDATE of the record, one of the
// positions row, COMMIT, in one pipeline). Reported per message.
func BenchmarkProjectionRun(b *testing.B) {
	const run = 32
	pool := benchDatabase(b)
	p := unitofwork.NewPostgres(pool)
	u := unitofwork.New(p, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3})
	ctx := context.Background()
	doc := func(n int) json.RawMessage {
		orders := make([]string, 400)
		for i := range orders {
			orders[i] = fmt.Sprintf("c-1-o%06d", n+i)
		}
		out, _ := json.Marshal(map[string]any{"client_id": "c-1", "orders": orders})
		return out
	}
	perMsg := func(b *testing.B) {
		b.ReportMetric(float64(b.N*run)/b.Elapsed().Seconds(), "msgs/s")
	}
	for _, mode := range []string{"raw", "run"} {
		b.Run(fmt.Sprintf("%s=%d", mode, run), func(b *testing.B) {
			id := eventstore.NewID()[:8]
			unit, err := p.Positions.Claim(ctx, "bench", id)
			if err != nil {
				b.Fatal(err)
			}
			version, pos := int64(0), int64(0)
			for b.Loop() {
				if mode == "raw" {
					var batch pgx.Batch
					batch.Queue(`BEGIN`)
					batch.Queue(`INSERT INTO records (kind, type, id, version, data, updated_at) VALUES ('projection', 'by_client', $1, 1, $2, now())
						ON CONFLICT (kind, type, id) DO UPDATE SET version = records.version + $3, data = $2, updated_at = now()`, id, string(doc(int(pos))), run)
					batch.Queue(`UPDATE consumer_positions SET positions = positions || jsonb_build_object('order', $1::bigint) WHERE consumer_group = 'bench' AND unit = $2`, pos+run, id)
					batch.Queue(`COMMIT`)
					if err := pool.SendBatch(ctx, &batch).Close(); err != nil {
						b.Fatal(err)
					}
					pos += run
					continue
				}
				steps := make([]unitofwork.Step, run)
				for i := range steps {
					pos++
					steps[i] = unitofwork.Step{
						Fence: &position.Fence{Group: "bench", Unit: id, Generation: unit.Generation, Advance: map[string]int64{"order": pos}},
						Changes: []unitofwork.Change{{Effects: &abi.Effects{Writes: []abi.Write{{Kind: abi.RecordProjection, Type: "by_client",
							ID: id, ExpectedVersion: version, Data: doc(int(pos))}}}}},
					}
					version++
				}
				if out, err := u.CommitRun(ctx, steps); err != nil || len(out) != run {
					b.Fatalf("%d of %d committed: %v", len(out), run, err)
				}
			}
			perMsg(b)
		})
	}
}

// BenchmarkConcurrentCommands is 64 concurrent HTTP commands on one
// category (each a record write, an event in its own stream, its outbox
// row), on one pool of 16 connections, in one run:
//   - raw: per command, BEGIN, the category's advisory lock, one
//     single-row INSERT, COMMIT, in one pipeline: the floor, serialised by
//     the same lock as the appends;
//   - alone: UnitOfWork.Commit with group commit off (GroupCommit 1);
//   - grouped: UnitOfWork.Commit with group commit (the default).
//
// Compare msgs/s; txs/msg is the transactions per command.
func BenchmarkConcurrentCommands(b *testing.B) {
	const committers = 64
	base := benchDatabase(b)
	cfg := base.Config()
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, k text NOT NULL, data jsonb)`); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"raw", "alone", "grouped"} {
		b.Run(mode, func(b *testing.B) {
			var txs atomic.Int64
			group := 1
			if mode == "grouped" {
				group = 0
			}
			u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default",
				MaxRetries: 3, GroupCommit: group, Committed: func() { txs.Add(1) }})
			run := eventstore.NewID()[:8]
			var seq atomic.Int64
			b.SetParallelism((committers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("%s%s%d", run, mode[:1], seq.Add(1))
					if mode == "raw" {
						var batch pgx.Batch
						batch.Queue(`BEGIN`)
						batch.Queue(`SELECT pg_advisory_xact_lock(message_store.hash_64('order'))`)
						batch.Queue(`INSERT INTO bench_raw (k, data) VALUES ($1, $2)`, id, `{"status":"placed"}`)
						batch.Queue(`COMMIT`)
						if err := pool.SendBatch(ctx, &batch).Close(); err != nil {
							b.Error(err)
							return
						}
						txs.Add(1)
						continue
					}
					if _, err := u.Commit(ctx, unitofwork.Change{Effects: placeOrder(id, `"c-1"`)}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(txs.Load())/float64(b.N), "txs/msg")
		})
	}
}
