// Package record stores the host's mutable state: aggregates, projection
// documents and process-manager state, each a JSON document under a Key,
// guarded by optimistic concurrency.
//
// A record's Version counts its writes. Version 0 means the record was never
// written. A write names the version it expects and gives the record
// ExpectedVersion+1; if the record has moved on, the write fails with a
// [*VersionError] (which wraps [ErrExpectedVersion]) and nothing of its batch
// is written. A write with nil or JSON null Data deletes the record's data
// but keeps its version as a tombstone, so a writer that read the record
// before the delete cannot bring it back unnoticed.
//
// Commit is an all-or-nothing compare-and-set over a batch. Several writes to
// one key in a batch chain: the second expects the version the first gives.
//
// # Transactions
//
// The unit of work writes records in the same transaction as its events and
// outbox rows. The memory store offers that through [Memory.Begin]: a
// [MemoryTx] holds the store's write lock until Commit or Rollback, stages
// writes (checked against committed and staged versions), reads its own
// staged writes, and merges them record by record at Commit. Readers outside
// the transaction never wait for it and see committed records only.
//
// [Postgres] keeps records in the records table (package schema migrates
// it): an update is one UPDATE ... WHERE version = expected and a create one
// INSERT ... ON CONFLICT DO NOTHING, so a stale write matches zero rows and
// fails with a VersionError; READ COMMITTED is enough. [Postgres.Tx] is the
// same store inside a caller's pgx transaction, seeing its own writes.
//
// The conformance suite in package storetest pins all of this; the memory
// and PostgreSQL stores both run it.
package record
