package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/proteanhq/protean-host/internal/config"
)

// The connection pools are sized from what the host may run at once, so
// that no call waits for a connection while its server has room (issue
// 37): pgx's default, max(4, CPUs), queued 64 concurrent requests behind 4
// connections on 2 cores, and go-redis's, 10 per CPU, had 21 partition
// workers waiting for one while Redis used a sixth of a core.
//
// What holds a connection:
//   - a guest call, for one host call (load, read_stream) at a time, and
//     its handler's commit after it: at most the modules' instances
//     (plugins.limits.max_instances, GOMAXPROCS by default, per module);
//   - on PostgreSQL, besides: HTTP reads (a projection's document, the
//     read-your-writes checks), the group commits of commands, the relay
//     and the event-store subscriptions: 4 per CPU;
//   - on Redis: each partition run reads its next batch and acks its last
//     one (twice the instances), each ordinary consumer group and each
//     partition listener blocks one connection for its block slice (one
//     per module), plus the relay's publishes, heartbeats and lag scrapes
//     (8).
//
// A URI that sets its own size (pool_max_conns for PostgreSQL, pool_size
// for Redis) keeps it. PostgreSQL's size is at most maxPostgresPool and
// at most a quarter of the server's connections (serverShare), so that
// several hosts fit PostgreSQL's max_connections.

// Bounds of the derived PostgreSQL pool.
const (
	minPostgresPool = 16
	maxPostgresPool = 64
)

// poolSizes are the derived sizes and how they were reached.
type poolSizes struct {
	postgres, redis int
	modules         int // the *.wasm files of the plugins directory at start
	instances       int // their instances' bound, in all
}

// derivePools sizes the pools for modules modules under cfg's limits on
// procs CPUs.
func derivePools(cfg config.Config, modules []string, procs int) poolSizes {
	instances := 0
	for _, m := range modules {
		n := cfg.ModuleLimits(m).MaxInstances
		if n <= 0 {
			n = procs
		}
		instances += n
	}
	return poolSizes{
		postgres:  min(max(instances+4*procs, minPostgresPool), maxPostgresPool),
		redis:     max(10*procs, 2*instances+len(modules)+8),
		modules:   len(modules),
		instances: instances,
	}
}

// hostPools sizes the pools for the plugins directory as it is now; a
// directory that cannot be read counts no modules (the loader reports
// it).
func hostPools(cfg config.Config) poolSizes {
	var modules []string
	if ents, err := os.ReadDir(cfg.Plugins.Dir); err == nil {
		for _, e := range ents {
			if !e.IsDir() && filepath.Ext(e.Name()) == ".wasm" {
				modules = append(modules, strings.TrimSuffix(e.Name(), ".wasm"))
			}
		}
	}
	return derivePools(cfg, modules, runtime.GOMAXPROCS(0))
}

// String says how the sizes were reached, for the start-up log.
func (p poolSizes) String() string {
	return fmt.Sprintf("%d modules, %d instances in all", p.modules, p.instances)
}
