// Package local implements the operations API (package ops) over a host's
// own stores: the Redis partitions' admin (package redispartition), the
// event-store subscriptions' positions, leases and failure records
// (package subscription), the outbox, the broker's dead letters, and the
// audit log every action is recorded in. The running host serves a
// Service over HTTP (package httpapi, /v1/ops); the CLI runs one directly
// on the stores its config names, in the ops.All scope.
//
// It is its own package so that what serves the API need not link what
// implements it: httpapi depends on package ops alone, and so on no Redis
// client (partition.TestPostgreSQLPathsImportNoRedis).
package local
