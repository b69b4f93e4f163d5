// Package redispartition runs per-key sequential processing (package
// partition's keys and units) across many host instances on Redis Streams:
// the lease protocol with fencing tokens ([Leases]), the partitioned
// consumer ([Consumer]), the operator actions on halted partitions
// ([Admin]) and the Redis key layout they share with the broker's publish
// script (layout.go). docs/partitions.md is the design; model/ checks the
// protocol with spin.
//
// # The protocol
//
// A unit (a partition "{category}:{key}" of one consumer group, or a
// process manager's correlation value across its categories) is worked on
// only under a lease. [Leases.Acquire] gives the next generation from a
// counter that is never deleted (the lease holds while its owner
// heartbeats in the hosts set, [Leases.Heartbeat]; a lapsed owner's lease
// is taken over by a compare and set on its token); every read, reclaim, ack, attempt count,
// halt and reap checks the caller's token "{owner}:{generation}" in the
// same Lua script, and refuses a stale one with [ErrLeaseLost]. The token
// is also the Redis consumer name, so each generation has its own pending
// entries list, and a new owner moves its predecessor's pending entries to
// itself with a fenced XAUTOCLAIM before it reads (pending first, then new),
// then deletes the earlier generations' consumers that hold nothing
// ([Leases.DropStale]), so consumers do not pile up over handovers.
//
// The side effect is fenced too: a new owner claims the unit's row in the
// table of consumer positions (package position), bumping its generation,
// before it handles anything; each run's effects commit with the unit's
// position (the event-store global position of the last message applied,
// per source stream) in one transaction that checks that generation. So a
// stalled owner's late commit is rejected, and a message redelivered after
// a crash between commit and ack is recognised and acked unhandled.
//
// Each message also carries prev, the global position of the message
// before it on its stream (the outbox relay sets it). A worker that has
// applied less than prev on the stream, and was not told by an operator to
// go on past it ([AcceptedKey]: a skipped head, a resumed gap), is missing
// a message the stream lost: it halts the unit there ([ErrGap]) instead of
// applying the message past it, which would move the position beyond the
// lost one for good. A message without prev (0) is not checked, nor the
// first message a worker sees on a stream it has applied nothing on.
//
// # The consumer
//
// [Consumer] heartbeats (one script, however many leases it holds) and
// discovers units from the category indexes: each heartbeat it walks the
// next page of them with a cursor (SSCAN, at least 1,000 keys and a
// twentieth of the index, so a unit no wake-up announced is found within
// 20 heartbeats), then counts them (SCARD), and walks them whole when it
// starts, when a host left or lapsed, and after its listener failed. It
// acquires the free units it finds and takes over those of lapsed hosts
// in bulk, up to its fair share of each group while other hosts consume
// it too (the group's units over its live consumers, plus one, handing
// the excess over at a batch boundary), and runs one worker per owned
// unit. A free unit it passes by for its share is tried again by its
// next placement with room (a wake-up's or a pass's). Heartbeat and discovery have connections of their own
// ([Leases.Dedicated]), so they do not queue behind the workers. Workers do not poll: a publish also adds an entry naming
// its keys to the category's wake-up stream (WakeKey), on which each
// consumer blocks with one XREAD ([Listener]); it wakes the worker of each
// key, or acquires the key's unit at once when it is new. An idle worker
// reads again without a wake-up only as a safety net, after Poll, spread
// so that a consumer re-reads about 200 idle units a second however many
// it holds; a listener that failed, or fell so far behind that its stream
// was trimmed past it, wakes every worker. A worker hands runs of up to [ConsumerOptions].BatchSize
// messages of one source (the primary stream before its backfill lane) to
// the [delivery.Handler]. Its first step on a unit is one round trip
// ([Leases.Take]: reclaim, drop stale consumers, first read, a pipeline of
// fenced scripts, each checking the token); a read script answers the ids
// it delivered, and their bodies come by a plain XRANGE sent with it
// (entries are immutable; Lua turning 64 bodies into Lua values and back
// cost about four times the XREADGROUP). A read of new entries that comes
// back short ends the burst: the worker waits for a wake-up instead of
// reading the stream empty. It holds the acks of what committed for up
// to [ConsumerOptions].AckDelay, and its next read carries them ahead of
// it in the same round trip (a busy key: one round trip a message); with
// no read to ride with they go on their own, and before the worker reaps,
// halts or lets go of its unit. A failure at message k commits the messages before k and
// retries k alone. After max_retries failed attempts (counted in Redis, so
// failover does not reset them), or at once for a non-retryable error, the
// unit halts: a durable halt record is written and the lease released in
// one step, and no instance acquires the unit until an operator resumes,
// skips or dead-letters the head ([Admin]). A worker whose servers fail it
// (Redis or PostgreSQL unreachable, restarting or stalled) keeps its lease
// and retries in place on the infrastructure pause of package delivery,
// never counting the failure; every step it retries is fenced, and the
// heartbeat stops it if the lease is lost meanwhile. Quiet workers trim what every
// group acked and, after reap_idle_ms, reap the partition. Stop releases
// every lease, so successors take over at once.
//
// # Key layout
//
// For a category C (its partition streams are package partition's):
//
//	C:__partitions__  the set of live keys of C    (IndexKey)
//	C:__wake__     the wake-up stream of C         (WakeKey)
//
// The index records the base key only, never the lane.
package redispartition
