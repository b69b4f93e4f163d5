package loadgen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// latencyThresholdMS is the Redis latency monitor's threshold in a
// profiled run: events of at least this many milliseconds are recorded.
const latencyThresholdMS = 5

// watchRedisLatency turns on Redis's latency monitor (LATENCY DOCTOR's
// source: fsyncs, forks, slow commands, expiry cycles) at addr, and
// returns what writes its history, every event at or over
// latencyThresholdMS with its Unix second, to redis-latency.txt in dir:
// a stall of every Redis client at once, to set beside the slowest
// orders (their times are in {config}-orders.csv).
func watchRedisLatency(ctx context.Context, addr, dir string) (func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := rdb.ConfigSet(ctx, "latency-monitor-threshold", fmt.Sprint(latencyThresholdMS)).Err(); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return func() {
		defer rdb.Close()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		text, err := redisLatency(dctx, rdb)
		if err != nil {
			text = fmt.Sprintf("LATENCY: %v\n", err)
		}
		_ = os.WriteFile(filepath.Join(dir, "redis-latency.txt"), []byte(text), 0o644)
	}, nil
}

// redisLatency is every event's history in LATENCY HISTORY, one spike a
// line: its UTC second, the event, its milliseconds.
func redisLatency(ctx context.Context, rdb *redis.Client) (string, error) {
	latest, err := rdb.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Redis latency events of %d ms or more (LATENCY HISTORY; UTC second, event, ms)\n", latencyThresholdMS)
	for _, e := range latest {
		fields, ok := e.([]any)
		if !ok || len(fields) == 0 {
			continue
		}
		name := fmt.Sprint(fields[0])
		hist, err := rdb.Do(ctx, "LATENCY", "HISTORY", name).Slice()
		if err != nil {
			return "", err
		}
		for _, h := range hist {
			pair, ok := h.([]any)
			if !ok || len(pair) != 2 {
				continue
			}
			sec, _ := pair[0].(int64)
			ms, _ := pair[1].(int64)
			fmt.Fprintf(&b, "%s %s %d\n", time.Unix(sec, 0).UTC().Format(time.RFC3339), name, ms)
		}
	}
	return b.String(), nil
}
