package main

import (
	"os"
	"path/filepath"
)

// The connection pools are sized to the servers, and the Redis pool to
// the connections the host's own blocked reads hold (issue 37).
//
// PostgreSQL: 16, and at most a quarter of the server's connections
// (serverShare), so that four hosts and an operator's tools fit its
// max_connections. A pool sized to what the host may run at once (the
// modules' instances, plus 4 per CPU for reads, commits, the relay and
// the subscriptions: 49 for production.toml under make load) queued less
// in the pool and more in PostgreSQL, which then spent more CPU per order
// on the same 2 cores: make load, one host, back to back, gave 524 and 475
// orders/s at 16 connections (PostgreSQL 0.62-0.63 cores), 441 at 24
// (0.66) and 456 at 49 (0.74). A wait for a connection while PostgreSQL
// is busy is the queue it would otherwise keep itself; the pool's waits
// are in its metrics to show when it is not.
//
// Redis: go-redis's 10 per CPU, plus one per module and one for the
// partition listener. Each ordinary consumer group blocks a connection in
// XREAD for its block slice, and the listener one for its own reads;
// without room for them, 21 partition workers waited for a connection
// while Redis used a sixth of a core. Redis runs one command at a time:
// more connections than that queue in its socket buffers instead (173,
// sized by the instances, did no better than 20).
//
// A URI that sets its own size (pool_max_conns for PostgreSQL, pool_size
// for Redis) keeps it.

// defaultPostgresPool is the PostgreSQL pool's size within the server's
// share.
const defaultPostgresPool = 16

// redisPoolSize is the Redis pool's size for modules modules on procs
// CPUs.
func redisPoolSize(modules, procs int) int { return 10*procs + modules + 1 }

// countModules counts the *.wasm files of the plugins directory as it is
// now; a directory that cannot be read counts none (the loader reports
// it).
func countModules(dir string) int {
	n := 0
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if !e.IsDir() && filepath.Ext(e.Name()) == ".wasm" {
				n++
			}
		}
	}
	return n
}
