// Package chaos is the fault-injection harness behind `make chaos`: it runs
// the real protean-host binary as several hosts against a private
// PostgreSQL and Redis it starts itself, puts load on them, breaks things
// on a schedule derived from a seed, and then checks from outside that
// nothing accepted was lost, duplicated or reordered.
//
// The pieces, each usable alone:
//
//   - [Proxy]: a loopback TCP proxy between one host and one server that
//     can [Proxy.Cut] every connection (reset, and refuse new ones) or
//     [Proxy.Stall] one direction (bytes held, not dropped), until
//     [Proxy.Resume].
//   - [Postgres] (pg_ctl, so a fault can `pg_ctl restart -m fast` or
//     `-m immediate`; as root every binary runs as the postgres user) and
//     [Redis] (appendonly yes, appendfsync always: a kill -9 or SHUTDOWN
//     NOSAVE loses nothing acknowledged; [Redis.Wipe] before a start is
//     the "restarted empty" fault).
//   - [Host]: one `protean-host run` process on configs/production.toml
//     with the harness's settings over it ([WriteConfig]: its proxies,
//     its port, its own plugins directory, lease_ttl_ms and the outbox's
//     lock_timeout_ms at 3 s so faults resolve quickly).
//   - [StartLoad]: clients, each with its own client_id, placing one order
//     at a time; the next only after the previous was answered 2xx or
//     4xx, so each client's acceptance order is defined; a 5xx, an error
//     or a timeout is resent with the same Idempotency-Key to a random
//     host.
//   - [Plan]: the schedule. Every kind of [Kinds] alone once, in an order
//     the seed shuffles, then steps mixing two kinds on different targets
//     (hosts, Redis, PostgreSQL); holds, restart delays and the proxies
//     a cut acts on come from the seed too. Which host a kill or a stop
//     hits is decided when it runs: the one owning the most partitions.
//   - [Run]: all of it, then the checks ([Outcome]) and the report.
//
// What the checks read, and why from outside: the clients' record of what
// was accepted (the only truth a user has), the event store's table
// (message_store.messages, by SQL on the server, not through a proxy), the
// projection client_orders/{client_id} over HTTP, the halt records
// ({group}:{unit}:__halt__) in Redis and `protean-host partitions list`,
// and the outbox's rows by status. A violation is any accepted order not
// stored exactly once, not projected exactly once, or projected out of
// its acceptance order; a 4xx whose order was stored anyway; a halted
// partition (the harness injects no poison message); an abandoned outbox
// row; an order never answered; projections still incomplete when the
// convergence bound (120 s) passes.
//
// Every wait is on a condition with a generous bound (until); a fixed
// duration appears only as a fault's own length (hold). Every process the
// harness starts is stopped by it on every path out of Run, a canceled
// context (SIGINT in cmd/chaos) included; hosts and Redis also get
// SIGKILL from the kernel if the harness dies (Pdeathsig), PostgreSQL,
// which pg_ctl detaches, does not.
package chaos
