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
//
// The slow log is kept too (slowlog-log-slower-than at the same
// threshold, its last slowLogKept entries): which commands, scripts with
// their keys, were the "command" events.
func watchRedisLatency(ctx context.Context, addr, dir string) (func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	for _, set := range [][2]string{
		{"latency-monitor-threshold", fmt.Sprint(latencyThresholdMS)},
		{"slowlog-log-slower-than", fmt.Sprint(latencyThresholdMS * 1000)},
		{"slowlog-max-len", fmt.Sprint(slowLogKept)},
	} {
		if err := rdb.ConfigSet(ctx, set[0], set[1]).Err(); err != nil {
			_ = rdb.Close()
			return nil, err
		}
	}
	return func() {
		defer rdb.Close()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		text, err := redisLatency(dctx, rdb)
		if err != nil {
			text = fmt.Sprintf("LATENCY: %v\n", err)
		}
		slow, err := redisSlowLog(dctx, rdb)
		if err != nil {
			slow = fmt.Sprintf("SLOWLOG: %v\n", err)
		}
		text += "\n" + slow
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

// slowLogKept is how many slow commands Redis keeps in a profiled run.
const slowLogKept = 1024

// slowArgs bounds the arguments of a slow command the file shows, and
// slowArg each one's length.
const (
	slowArgs = 6
	slowArg  = 48
)

// redisSlowLog is Redis's slow log, oldest first, one command a line: its
// UTC time to the second, its duration and its first arguments (a
// script's SHA, its key count and first keys).
func redisSlowLog(ctx context.Context, rdb *redis.Client) (string, error) {
	entries, err := rdb.SlowLogGet(ctx, slowLogKept).Result()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Redis commands of %d ms or more (SLOWLOG, oldest first; UTC second, ms, command)\n", latencyThresholdMS)
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		args := e.Args
		more := ""
		if len(args) > slowArgs {
			args, more = args[:slowArgs], fmt.Sprintf(" (+%d)", len(e.Args)-slowArgs)
		}
		shown := make([]string, len(args))
		for j, a := range args {
			a = strings.Join(strings.Fields(a), " ") // a script's lines, one line
			if len(a) > slowArg {
				a = a[:slowArg] + "…"
			}
			shown[j] = a
		}
		fmt.Fprintf(&b, "%s %.1f %s%s\n", e.Time.UTC().Format(time.RFC3339), float64(e.Duration)/float64(time.Millisecond), strings.Join(shown, " "), more)
	}
	return b.String(), nil
}
