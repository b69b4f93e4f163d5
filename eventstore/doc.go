// Package eventstore stores events in streams with the semantics of
// MessageDB (github.com/message-db/message-db), so that a PostgreSQL store
// can be MessageDB itself and the memory store behaves the same way.
//
// A stream is named "{category}-{id}"; its category is the part before the
// first '-' (see [Category]), so "order-a-b" belongs to category "order"
// and "orders-1" does not. Each event gets two positions:
//
//   - Position, 0-based and gapless within its stream. A stream's version
//     is the position of its last event, or [NoStream] (-1) when it has
//     none.
//   - GlobalPosition, 1-based and strictly increasing across the store. It
//     orders category and $all reads. A PostgreSQL store may leave gaps
//     (a rolled-back append consumes a value); the memory store does not.
//
// Reads page inclusively: ReadStream returns positions >= from, ReadCategory
// and ReadAll return global positions >= from, ascending. A consumer pages
// from the last position it saw plus one.
//
// Append is atomic for its batch and checks optimistic concurrency per
// event: an event whose ExpectedVersion is not [AnyVersion] must find its
// stream at that version, counting the events before it in the same batch.
// A mismatch fails the whole batch with a [*VersionError], which wraps
// [ErrExpectedVersion].
//
// # Transactions
//
// The unit of work appends events in the same transaction as its record
// writes and outbox rows. The memory store offers that through
// [Memory.Begin]: a [MemoryTx] holds the store's write lock until Commit or
// Rollback, stages appends (checked against committed and staged events) and
// publishes them at Commit. Readers never wait for a transaction; they see
// committed events only. Both the store and a transaction satisfy
// [Appender].
//
// The conformance suite in package storetest pins all of this; every Store
// implementation runs it.
//
// # PostgreSQL
//
// [Postgres] is MessageDB's schema and functions (message_store.messages,
// write_message, category, hash_64; package schema migrates them, and an
// existing MessageDB database is adopted as it is): an append takes the
// per-category advisory lock MessageDB takes, held to commit, so a
// category's global positions commit in order and category reads have no
// holes. [Postgres.Tx] appends inside a caller's pgx transaction.
// [QueueAppend] queues a unit of work's appends on its one-round-trip
// pipeline: one statement for all its events, raising when refused, which
// can carry a [Rider] (the outbox's rows) so that they are written from
// the appended rows by the same statement.
package eventstore
