// Package position is the table of consumer positions: one row per
// (consumer group, unit), holding the unit's current owner's fencing
// generation and, per source stream the unit reads, the event-store global
// position of the last message whose effects committed. docs/partitions.md
// is the design it belongs to.
//
// # Who uses it
//
//   - A partition worker (package partition, issue 7): unit "{category}:{key}"
//     with its stream and its backfill lane as sources, or
//     "{pm}:{correlation}" for a process manager, one source per category
//     stream it reads.
//   - An event-store subscription (issue 9): unit "{category}" or "$all",
//     one source.
//
// Both commit through unitofwork.CommitFenced, which runs Advance in the
// same transaction as the handler's effects.
//
// # The rule
//
// A new owner calls [Store.Claim] before it handles anything: the row's
// generation goes up by one (the row is created at 1), and the owner reads
// where to resume from the returned positions. Every effect transaction of
// that owner then carries a [Fence]: Advance commits only if the row still
// holds the owner's generation ([ErrFenced] otherwise: a newer owner has
// claimed the unit, and the stale owner's effects roll back) and only if
// each advanced source moves strictly forward ([ErrApplied] otherwise: the
// message was applied already, and is acked without its effects). Both
// errors roll the whole unit of work back, so a message's effects and its
// position commit together or not at all, and a message is applied once
// however often it is delivered and whoever delivers it.
//
// The generation is the row's own counter, not the Redis lease's: a flushed
// or failed-over Redis cannot make an old owner look new to the database.
//
// # Why global positions, not Redis entry ids
//
// Positions are event-store global positions. Within one category, commits
// follow global position order (MessageDB's per-category lock is held to
// commit) and the outbox relays one key's rows in commit order, so along
// each source stream global positions strictly increase. Redis entry ids
// do not survive the stream: when a reaped stream is re-created its ids
// restart, lower, and a new entry would look applied. Global positions
// never restart, so a new message never looks applied and an applied one
// never looks new.
//
// # Implementations
//
// [Memory] (the embedded default; its transactions, Claim and Set share one
// write lock, so a Claim waits for an open effect transaction as it does in
// PostgreSQL) and [Postgres] (the consumer_positions table of package
// schema: Claim is one upsert, Advance one UPDATE in the happy path, whose
// row lock orders it against Claim). Both pass the conformance suite in
// package positiontest.
//
// # Announcements
//
// A [Postgres] store made [Postgres.Notifying] also sends, in each effect
// transaction, a notification on [Channel] of the advances it commits
// ([Advanced]: group, unit, the positions its fences moved it to); a
// notification is delivered when, and only if, its transaction commits.
// [Advances] decodes them for a listener (package pglisten; the host's one
// LISTEN connection is shared by every part that hears). The host turns them
// on for the partition workers, so that a read of one's own write waiting
// on a host that does not run the key's unit ends when the unit commits
// (package readyourwrites, Waiter.HandledElsewhere), without reading the
// unit's row. They are a hint: a listener misses what commits while it
// is not connected, and the waits poll the row as a safety net.
package position
