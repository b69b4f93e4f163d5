// Command loadgen measures protean-host end to end over HTTP on a private
// PostgreSQL and Redis, beside the raw commit-and-publish floor in the same
// run (package loadgen), and prints a Markdown table of the figures.
//
//	make build plugins && go run ./cmd/loadgen -hosts 1,3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proteanhq/protean-host/internal/chaos"
	"github.com/proteanhq/protean-host/internal/loadgen"
)

func main() {
	var o loadgen.Options
	hosts := flag.String("hosts", "1,3", "comma-separated host counts to measure")
	flag.StringVar(&o.Bin, "bin", "build/protean-host", "the protean-host binary (make build)")
	flag.StringVar(&o.Plugins, "plugins", "build/plugins", "the example modules (make plugins)")
	flag.StringVar(&o.Root, "root", ".", "the repository root (configs/production.toml)")
	flag.IntVar(&o.Clients, "clients", 64, "concurrent clients")
	flag.IntVar(&o.KeysPerClient, "orders-per-key", 50, "orders a client places for one client_id before it moves to the next (bounds each document's size)")
	flag.StringVar(&o.Profile, "profile", "", "a directory for each host's CPU, block, mutex and allocation profiles and goroutine dump over each maximum phase, and summary.txt (printed after the table): every process's CPU and the profiles' top entries")
	flag.IntVar(&o.PostgresPool, "postgres-pool", 0, "the hosts' PostgreSQL pool size (0: each host derives its own)")
	flag.IntVar(&o.RedisPool, "redis-pool", 0, "the hosts' Redis pool size (0: each host derives its own)")
	flag.Func("redis-fsync", "Redis's appendfsync for the floor and the hosts: everysec (default; like PostgreSQL's fsync=off here, it survives a kill of the server, not a crash of the machine) or always", func(s string) (err error) {
		o.RedisFsync, err = chaos.ParseFsync(s)
		return err
	})
	flag.DurationVar(&o.Duration, "duration", 20*time.Second, "length of each phase (maximum, half load) of each configuration")
	flag.IntVar(&o.CompareHosts, "compare-hosts", 1, "how many hosts each -compare setting, -compare-bin binary and -compare-plugins directory runs on")
	flag.Func("compare", "a setting table.key=value (TOML value) to measure after the host counts, on -compare-hosts hosts, beside the same run's figures; repeat for more", func(s string) error {
		o.Compare = append(o.Compare, s)
		return nil
	})
	flag.Func("compare-bin", "another protean-host binary (a build of another commit) to measure after the host counts, on -compare-hosts hosts, beside the same run's figures; repeat for more", func(s string) error {
		o.CompareBins = append(o.CompareBins, s)
		return nil
	})
	flag.Func("compare-plugins", "a directory of modules (build/plugins-c: the examples in C) to measure after the host counts in place of their namesakes of -plugins, on -compare-hosts hosts, beside the same run's figures; repeat for more", func(s string) error {
		o.ComparePlugins = append(o.ComparePlugins, s)
		return nil
	})
	flag.IntVar(&o.Rounds, "rounds", 1, "measure the whole run this many times on the same servers, every second round with the host configurations in reverse order, and print each configuration's medians")
	flag.Parse()
	for _, h := range strings.Split(*hosts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "loadgen: -hosts %q: want positive integers\n", *hosts)
			os.Exit(2)
		}
		o.Hosts = append(o.Hosts, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rows, err := loadgen.Run(ctx, o)
	if len(rows) > 0 {
		fmt.Print(loadgen.Table(rows))
	}
	if o.Profile != "" {
		if b, err := os.ReadFile(filepath.Join(o.Profile, "summary.txt")); err == nil {
			fmt.Printf("\nProfiles in %s:\n\n%s", o.Profile, b)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
