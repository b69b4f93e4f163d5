// Package audit keeps the record of what operators and deployers did: who
// (the credential's name, never its secret), for which tenant, which
// action on which target, and its outcome, in the order they were done.
//
// The record is durable where the host's stores are: a table,
// protean_audit, on PostgreSQL (package schema migrates it), and memory
// for the embedded host, whose state is all in memory anyway. The
// operations API (GET /v1/ops/audit), the status page and the CLI read it
// back, a tenant's operator seeing only that tenant's entries.
//
// Partition actions are also written, as before, to the Redis stream
// protean:audit (package redispartition), where they happen.
package audit
