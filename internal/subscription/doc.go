// Package subscription delivers events straight from the event store to
// handlers, exactly once, without a broker: Protean's `event_store`
// subscription type, and MessageDB's consumers with position streams.
//
// A [Subscription] is one consumer group (a handler) reading one category,
// or [All]. Its unit in the table of consumer positions (package position)
// is the category (or "$all"), with one source of the same name. A
// [Consumer] runs every subscription this host holds the lease of, one
// worker each.
//
// # Exactly once
//
// A worker first claims its unit (position.Store.Claim bumps the fencing
// generation) and resumes after the stored position. It reads batches by
// global position and hands each to the handler (engine.Handler(), the
// same batch handler the Redis partition workers use), which commits each
// message's effects and the unit's position in one fenced unit of work
// (unitofwork.CommitFenced). So a message's effects and its position
// commit together or not at all; a redelivery is ErrApplied and is not
// applied again; a stale owner's commit is ErrFenced and rolls back.
//
// # One owner across hosts
//
// [Leases] give one owner per (group, unit): in PostgreSQL a row in
// subscription_leases with owner and expires_at (the database's clock),
// taken by an upsert when missing, lapsed or the caller's own, renewed
// every Heartbeat, released on a clean stop. A session advisory lock was
// the other candidate: it dies with its connection, which is what we want
// from a dead host, but a pgx pool hands connections around, so the lock
// would need a connection pinned per unit for the lease's lifetime, and a
// stalled host keeps its TCP session (and its lock) until the kernel gives
// up on it. A lease row lapses on time whatever the network does. The
// lease is liveness only; safety is the generation in the positions row,
// checked in every effect transaction: a host that lost its lease while
// stalled cannot commit after its successor's claim. A dead host's units
// move within LeaseTTL plus one Heartbeat. [MemoryLeases] serve the
// embedded single process.
//
// # Gaps in global positions (Protean bug 1088)
//
// Global positions come from a sequence taken at insert, so a transaction
// that commits late leaves a hole below positions already visible. Within
// one category that cannot happen: every append holds the category's
// advisory lock to commit (MessageDB's write_message; eventstore.Postgres
// too), so a second append to the category waits for the first's commit
// and takes a higher position after it; a hole in a category read is a
// rolled-back append or another category's event, and never fills.
// TestPostgresCategoryAppendsCommitInPositionOrder proves it. A category
// subscription therefore never holds.
//
// A $all subscription can see a later position first (appends to different
// categories run in parallel). It treats any missing position between its
// position and the next event read as a gap: it handles what lies before
// the gap, holds, re-reads every Poll, and goes on when the hole fills; if
// GapTimeout (default 5 s, Protean's) passes first, it abandons the gap
// with a WARN log and protean_subscription_gaps_total{outcome="abandoned"}
// (a rolled-back append, which never fills, costs that wait once per
// owner). The durable position is only ever the last handled event, so it
// never passes an unresolved gap. A fresh subscription (no position yet)
// starts at the first event it reads: positions below it are not a gap.
// We chose this over a "visible up to" bound from pg_snapshot_xmin: a
// transaction takes its sequence value before it has an xid, so a snapshot
// can miss it, and the bound would need the event store's transaction ids,
// which MessageDB's schema does not keep.
//
// # Failures
//
// A handler failure of a message (Options.Classify; engine.Classify) is
// retried after RetryDelay, doubling, MaxRetries times (a non-retryable one
// not at all), then recorded in [Failures] (subscription_failures in
// PostgreSQL) as failed, and the position moves past it, in one
// transaction ([Failures] Park: the fenced advance and the record), so a
// crash leaves both or neither (then the message runs again) and a stale
// owner, whose fence is refused, writes no record. In a partitioned subscription (its
// category has a sequential_by key) the failure halts its key: later
// messages of the key are recorded as held, in order, while other keys
// flow. An operator (protean-host subscriptions) sets a failed record to
// retry or skipped; the owner then reruns, in position order, the retried
// record and the held ones behind it. A rerun commits with its own source
// in the positions row ([RetrySource]), so it is applied once however
// often it runs; the source leaves the row when its record resolves
// (Failures.Settle, fenced by the owner's generation), since the row is
// rewritten by every effect transaction and reruns would otherwise grow
// it for good. Any other error (the database, a stopping engine) is
// retried with backoff without end: it never skips a message.
//
// # Order and per-key workers
//
// A worker handles its unit's events one batch at a time, in global
// position order. For a category with a sequential_by key, KeyWorkers > 1
// splits each batch into that many slots by a hash of the key ([Slot]) and
// runs the slots in parallel, each in order, so each key stays in order
// while different keys overlap (the guest call of one with the database
// round trips of another). Each slot commits with its own source in the
// unit's positions row ("{unit}#{slot}/{slots}@{key field}"); when every slot has
// finished the batch, a fence-only commit moves the unit's position to the
// batch's end: the low-water mark, below which nothing is uncommitted. A
// restart resumes after the mark, re-reads the same batch and gives each
// slot only its events above the slot's position (a batch an owner left
// unfinished is finished with that owner's slot count and key field, so
// keys map to the same slots even if the partitioning changed). One source per slot, not per key, keeps the row small. The
// cost: a slot that cannot commit (a database error) holds the next batch
// back for every key, as in sequential mode. Measured on 2 cores
// (engine.BenchmarkEventStoreSubscriptionWASM, the example projector on
// PostgreSQL): ~2,000 events/s with 1 worker, 3,400-6,600 with 2,
// 3,400-4,300 with 4; with a trivial native handler more workers are slower
// (more commits per batch). The default is 2.
//
// # Lifecycle
//
// Start runs the supervisor; Stop is soft (batches in hand commit, leases
// are released) then hard at its deadline (reads, calls and commits are
// canceled; nothing half-commits), as internal/lifecycle defines. Stop
// before Start and a second Stop are no-ops.
package subscription
