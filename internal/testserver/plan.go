package testserver

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Plan returns PostgreSQL's plan of sql (a statement, or EXECUTE of a
// prepared one) on conn, as EXPLAIN prints it, one line a node.
func Plan(tb testing.TB, conn *pgx.Conn, sql string, args ...any) string {
	tb.Helper()
	rows, err := conn.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		tb.Fatalf("EXPLAIN %s: %v", sql, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("EXPLAIN %s: %v", sql, err)
	}
	return strings.Join(lines, "\n")
}

// Pipelined runs in one transaction on pool what queue puts on a batch
// (a store's Queue… call), as the unit of work's pipeline does, and
// commits it when the reader queue returns reads its results without an
// error; that error is returned after the transaction rolled back.
func Pipelined(tb testing.TB, pool *pgxpool.Pool, queue func(*pgx.Batch) (func(pgx.BatchResults) error, error)) error {
	tb.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	b := &pgx.Batch{}
	read, err := queue(b)
	if err != nil {
		tb.Fatal(err)
	}
	br := tx.SendBatch(ctx, b)
	rerr := read(br)
	if err := br.Close(); rerr == nil && err != nil {
		tb.Fatal(err)
	}
	if rerr != nil {
		return rerr
	}
	return tx.Commit(ctx)
}

// GenericPlans returns the generic plan (the one a connection keeps for a
// prepared statement after five runs) that a connection makes of prepare
// (PREPARE p(…) AS …) while table is empty, as run by execute (EXECUTE
// p(…)): planned once, empty, then after fill (an INSERT) before ANALYZE
// (as before autovacuum gets to the table) and after it. They are labelled
// by when.
func GenericPlans(tb testing.TB, pool *pgxpool.Pool, prepare, execute, table, fill string) map[string]string {
	tb.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	c := conn.Conn()
	exec := func(sql string) {
		tb.Helper()
		if _, err := c.Exec(ctx, sql); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`SET plan_cache_mode = force_generic_plan`) // what the plan cache picks after five runs
	exec(prepare)
	plans := map[string]string{"empty": Plan(tb, c, execute)}
	exec(fill)
	plans["filled, not analyzed"] = Plan(tb, c, execute)
	exec(`ANALYZE ` + table)
	plans["filled, analyzed"] = Plan(tb, c, execute)
	exec(`DEALLOCATE p`)
	exec(`RESET plan_cache_mode`)
	return plans
}

// ProbesKey reports whether plan (as Plan prints it) reaches table row by
// row through scan (an index scan, as EXPLAIN names it: "Index Scan using
// records_pkey on records r") in a nested loop, and never scans the whole
// table: the plan a multi-row statement's generic plan must keep.
func ProbesKey(plan, scan, table string) bool {
	return strings.Contains(plan, "Nested Loop") && strings.Contains(plan, scan) && !strings.Contains(plan, "Seq Scan on "+table)
}
