package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/position"
)

// prodConfigWithPrefix writes the shipped production config with the test's
// Redis key prefix and the tests' compile cache.
func prodConfigWithPrefix(t *testing.T, prefix string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(wasmbuild.Root(), "configs", "production.toml"))
	require.NoError(t, err)
	s := string(raw)
	require.Contains(t, s, "provider = \"redis\"\n")
	s = strings.Replace(s, "provider = \"redis\"\n", "provider = \"redis\"\nkey_prefix = \""+prefix+"\"\n", 1)
	s = strings.Replace(s, `cache_dir = ".cache/wasm"`, `cache_dir = "`+wasmbuild.CacheDir(t)+`"`, 1)
	require.Contains(t, s, "cache_max_mb = 256\n")
	s = strings.Replace(s, "cache_max_mb = 256\n", "cache_max_mb = 0\n", 1) // the shared test cache (see configFile)
	p := filepath.Join(t.TempDir(), "production.toml")
	require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	return p
}

// TestPartitionsCommands halts the client_orders projector's partition
// order:c-1 three times by hand (as a worker does on poison) and unblocks
// it with skip, dlq and resume, through the CLI against real Redis and
// PostgreSQL.
func TestPartitionsCommands(t *testing.T) {
	pgURL := testserver.Postgres(t)
	t.Setenv(config.EnvDatabaseURL, pgURL)
	redisURL, prefix := testserver.Redis(t)
	t.Setenv(config.EnvRedisURL, redisURL)
	cfg := prodConfigWithPrefix(t, prefix)
	dir := wasmbuild.Examples(t)
	ctx := context.Background()

	code, _, errs := cli(t, "migrate", "--config", cfg)
	require.Equal(t, 0, code, errs)

	opt, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	const group, unit = "client_orders", "order:c-1"
	for i := 1; i <= 3; i++ {
		msg := delivery.Message{ID: fmt.Sprintf("m-%d", i), Type: "OrderPlaced", Category: "order", EventStream: "order-o-1",
			Data: []byte(`{"order_id":"o-1","client_id":"c-1","total":1}`), GlobalPosition: int64(i), PartitionKey: "c-1"}
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + unit, Values: redisstream.Encode(msg)}).Err())
	}
	require.NoError(t, rdb.SAdd(ctx, prefix+redispartition.IndexKey("order"), "c-1").Err())
	leases := redispartition.NewLeases(rdb, prefix)
	// halt plays a worker that takes the unit, reads its head and halts on it.
	halt := func() string {
		t.Helper()
		l, err := leases.Acquire(ctx, group, unit, "host-x")
		require.NoError(t, err)
		_, err = leases.Reclaim(ctx, l, unit)
		require.NoError(t, err)
		es, err := leases.Read(ctx, l, unit, true, 1)
		require.NoError(t, err)
		if len(es) == 0 {
			es, err = leases.Read(ctx, l, unit, false, 3)
			require.NoError(t, err)
		}
		require.NotEmpty(t, es)
		id, _ := es[0].Values["id"].(string)
		require.NoError(t, leases.Halt(ctx, l, redispartition.Halt{Stream: unit, Entry: es[0].ID, MessageID: id, Reason: "boom", Attempts: 3, HaltedAt: time.Now()}))
		return es[0].ID
	}
	pool, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, position.NewPostgres(pool, nil).Set(ctx, group, unit, unit, 5))

	first := halt()
	code, out, errs := cli(t, "partitions", "list", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^CATEGORY\s+KEY\s+GROUP\s+OWNER\s+GEN\s+PENDING\s+LAG\s+STATE$`, out)
	require.Regexp(t, `(?m)^order\s+c-1\s+client_orders\s+-\s+-\s+3\s+0\s+halted$`, out)
	require.Contains(t, out, "1 partition(s), 1 halted")
	require.Contains(t, out, "halted: order c-1 group client_orders at entry "+first+" of order:c-1 (message m-1) after 3 attempt(s)")

	code, out, errs = cli(t, "partitions", "inspect", "order", "c-1", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "partition order c-1  group client_orders  state halted")
	require.Contains(t, out, "positions order:c-1=5")
	require.Contains(t, out, "halted at entry "+first)
	require.Regexp(t, `(?m)^order:c-1\s+`+first+`\s+halted\s+1\s+0\s+m-1\s+OrderPlaced\s+1\s+\{`, out)
	require.Regexp(t, `(?m)^order:c-1\s+\S+\s+pending\s+1\s+0\s+m-3\s+OrderPlaced\s+3\s+`, out)
	code, _, errs = cli(t, "partitions", "inspect", "order", "c-1:x", "--config", cfg, "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, `invalid partition unit: category "order" and key "c-1:x" name partition "x" of category "order:c-1"`)

	code, out, errs = cli(t, "partitions", "skip", "order", "c-1", "--by", "tester", "--reason", "bad data", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "skipped entry "+first+" of order:c-1 (message m-1) for group client_orders; acked: true")
	p, err := rdb.XPending(ctx, prefix+unit, group).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2), p.Count)

	code, _, errs = cli(t, "partitions", "skip", "order", "c-1", "--config", cfg, "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "partition order:c-1 is not halted in any consumer group")
	code, _, errs = cli(t, "partitions", "resume", "order", "c-1", "--group", group, "--config", cfg, "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "partition client_orders order:c-1: not halted: partition not halted")

	second := halt()
	code, out, errs = cli(t, "partitions", "dlq", "order", "c-1", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "moved entry "+second+" of order:c-1 (message m-2) for group client_orders to order:c-1:dlq as ")
	dl, err := rdb.XRange(ctx, prefix+"order:c-1:dlq", "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, "m-2", dl[0].Values["id"])

	third := halt()
	code, out, errs = cli(t, "partitions", "resume", "order", "c-1", "--group", group, "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "resumed order:c-1 for group client_orders: entry "+third+" (message m-3)")
	n, err := rdb.Exists(ctx, prefix+redispartition.HaltKey(group, unit)).Result()
	require.NoError(t, err)
	require.Zero(t, n)
	p, err = rdb.XPending(ctx, prefix+unit, group).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), p.Count, "resume leaves the head pending for a retry")

	audit, err := rdb.XRange(ctx, prefix+redispartition.AuditStream, "-", "+").Result()
	require.NoError(t, err)
	var actions []string
	for _, a := range audit {
		actions = append(actions, fmt.Sprint(a.Values["action"], " ", a.Values["by"]))
	}
	require.Equal(t, "skip cli:tester", actions[0])
	require.Len(t, actions, 3)
	require.Equal(t, "dlq", strings.Fields(actions[1])[0])
	require.Equal(t, "resume", strings.Fields(actions[2])[0])

	// The audit log has each action, done or refused, with its tenant (the config names none: "default").
	code, out, errs = cli(t, "audit", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^ID\s+AT\s+PRINCIPAL\s+TENANT\s+ACTION\s+TARGET\s+OUTCOME\s+REASON$`, out)
	require.Regexp(t, `(?m)^\d+\s+\S+\s+cli:tester\s+default\s+partitions.skip\s+order:c-1 group client_orders\s+ok\s+bad data$`, out)
	var entries []string
	rows, err := pool.Query(ctx, `SELECT action || ' ' || tenant || ' ' || (outcome = 'ok')::text FROM protean_audit ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var a string
		require.NoError(t, rows.Scan(&a))
		entries = append(entries, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"partitions.skip default true", "partitions.skip default false", "partitions.resume default false",
		"partitions.dlq default true", "partitions.resume default true"}, entries)

	code, out, errs = cli(t, "partitions", "list", "--group", "nobody", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "0 partition(s), 0 halted")
}

func TestPartitionsRefusesWithoutRedis(t *testing.T) {
	code, _, errs := cli(t, "partitions", "list", "--config", configFile(t, "inline"))
	require.Equal(t, 1, code)
	require.Contains(t, errs, `brokers.default.provider is "inline": partitions live on a Redis broker only`)
	code, _, errs = cli(t, "partitions", "skip", "order", "--config", configFile(t, "inline"))
	require.Equal(t, 2, code, "a usage error")
	require.Contains(t, errs, "partitions skip takes 2 arguments, got 1")
	code, _, errs = cli(t, "partitions", "frob")
	require.Equal(t, 2, code)
	require.Contains(t, errs, `unknown subcommand "frob"`)
	code, out, _ := cli(t, "partitions", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "CATEGORY is the process", "help on stdout")
}
