// Command chaos runs the fault-injection harness (package chaos) on the
// real protean-host binary: three hosts over a private PostgreSQL and
// Redis, load, a schedule of faults from a seed, then the checks. It
// exits 0 when every check passed, 1 on a violation, 2 when the harness
// itself could not run. `make chaos` runs it; see docs/operations.md,
// "Testing under faults".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/proteanhq/protean-host/internal/chaos"
)

func main() {
	os.Exit(run())
}

func run() int {
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "the schedule's `SEED` (printed, to run it again)")
	steps := flag.Int("faults", 0, "fault steps `N` (default: every kind alone once, then 3 mixed steps)")
	kinds := flag.String("kinds", "", "comma-separated fault `KINDS` to draw from (default all: "+fmt.Sprint(chaos.Kinds)+")")
	hosts := flag.Int("hosts", 3, "host processes")
	clients := flag.Int("clients", 6, "load clients, one client_id each")
	pace := flag.Duration("pace", 20*time.Millisecond, "pause of each client between two orders")
	ttl := flag.Duration("lease-ttl", 3*time.Second, "the hosts' lease_ttl_ms")
	settle := flag.Duration("settle", 120*time.Second, "bound of the convergence wait after the last fault")
	redisOutage := flag.Duration("outage-redis", 60*time.Second, "how long redis-down keeps Redis down")
	pgOutage := flag.Duration("outage-pg", 30*time.Second, "how long pg-down keeps PostgreSQL down")
	bin := flag.String("bin", "build/protean-host", "the protean-host binary (make build)")
	plugins := flag.String("plugins", "build/plugins", "the example modules (make plugins)")
	root := flag.String("root", ".", "the repository root (configs/production.toml, plugins/examples)")
	keep := flag.Bool("keep", false, "keep the run's directory (logs) even when it passed")
	flag.Parse()
	ks, err := chaos.ParseKinds(*kinds)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// ^C or a TERM cancels the run; Run stops everything it started
	// before it returns.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("chaos: seed %d (run again with SEED=%d)\n", *seed, *seed)
	rep, err := chaos.Run(ctx, chaos.Options{Seed: *seed, Steps: *steps, Kinds: ks, Hosts: *hosts, Clients: *clients, Pace: *pace,
		LeaseTTL: *ttl, Settle: *settle, RedisOutage: *redisOutage, PGOutage: *pgOutage, Bin: *bin, Plugins: *plugins, Root: *root, Keep: *keep})
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "chaos: interrupted; every process it started is stopped")
		return 2
	case err != nil:
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	case rep.Failed():
		return 1
	}
	return 0
}
