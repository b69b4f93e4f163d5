// Package redisstream is the Redis Streams broker: the production broker
// behind the seam of package broker, shared by every host instance of a
// deployment. It advertises ReliableMessaging, OrderedMessaging,
// BlockingRead, StreamPartitioning and (with Options.EnableDLQ)
// DeadLetterQueue, and passes the broker conformance suite
// (broker/brokertest) with every feature the inline broker claims.
//
// It has two parts: Publish, which the outbox relay calls for every row,
// and ordinary consumer groups (Next, Wait, Ack, Nack, DLQ, Replay, Stats,
// and broker.Batcher's NextBatch and Release) for unpartitioned streams. Partitioned streams are consumed by package
// partition under leases; it reuses this package's entry codec ([Encode],
// [Decode]) and nothing else.
//
// # Keys
//
// Every key below is prefixed with Options.Prefix (empty in production,
// so the names are exactly the design's; tests use one prefix each).
//
//	{stream}                       stream    the messages ({category}, {category}:{key}, {category}:{key}:{lane})
//	{category}:__partitions__      set       partition keys with a stream (partition.IndexKey); SADD by Publish
//	{stream}:__ids__               hash      message id -> entry id of each entry still in the stream: publish dedup and Ack/Nack by message id
//	{stream}:dlq                   stream    dead letters of every group, fields dl_group, dl_reason, dl_attempts, dl_failed_at, dl_entry
//	{stream}:__group__:{group}     hash      the group's delivery state: attempts, delivery times, due times, dead/discarded marks, dead letters' entry ids and replayed letters' fields
//	  ...:requeued                 zset      nacked or replayed entries, in entry order (the group's line)
//	  ...:inflight                 zset      delivered, unsettled entries by delivery second (for MessageTimeout)
//	  ...:wake                     stream    MAXLEN 1; Nack and Replay append to it to wake blocked Waits
//
// The consumer group itself is Redis's (XGROUP CREATE {stream} {group} 0
// MKSTREAM, made by the first Next or Wait of the group; a NOGROUP later
// re-creates it once). Whoever deletes a stream (the partition reaper)
// deletes its __ids__ hash too (partition.IDIndexKey names it for both).
//
// # Consumers
//
// Each host start has a new consumer name (Options.Consumer, by default
// owner.New(): hostname:pid and a random suffix), so without cleanup
// every restart would leave one more consumer in every group it read
// (XINFO CONSUMERS growing over deploys). A read (Next, Wait, NextBatch)
// therefore sweeps its group, on its first read of it and then at most
// every ConsumerIdle/2 ([Broker.SweepConsumers], one Lua script): it
// deletes (XGROUP DELCONSUMER) every other consumer that has no pending
// entries and has been idle (XINFO CONSUMERS idle, Redis's clock) longer
// than Options.ConsumerIdle, default 2 × MessageTimeout, and logs each at
// INFO with its stream, group and consumer.
//
// A consumer with pending entries is never deleted: DELCONSUMER drops its
// pending entries, and the trim (below) would then no longer hold their
// stream entries for the group. A dead consumer's entries leave its list
// as this package settles them: dead-lettered or discarded by
// MessageTimeout (XACK), or nacked and then redelivered to a live
// consumer (XCLAIM); the next sweep deletes it. (This package does not
// XAUTOCLAIM: a dead consumer's in-flight message is not redelivered, see
// Guarantees.) A live consumer that was merely idle may be deleted; its
// next XREADGROUP or XCLAIM creates it again, and no group state is kept
// per consumer, so nothing is lost. A group thus holds its live
// consumers plus those that stopped within the last 1.5 × ConsumerIdle.
//
// # Trimming and retention
//
// Redis memory is bounded by trimming, with one rule for ordinary and
// partition streams (package partition's Leases.Trim, one Lua script):
// the safe point of a stream is the minimum over its consumer groups of
// the group's lowest pending entry id if it has pending entries, else its
// last-delivered-id; every entry strictly below it has been acked by every
// group, and XTRIM MINID removes exactly those, with their fields in the
// __ids__ hash, in the same script. A stream with no group is not trimmed.
// Retention is therefore "until every existing group acked it": a group
// created after a trim (XGROUP CREATE at 0, by its first Next or Wait)
// starts at the entries left, not at the first message ever published.
//
// An ordinary stream is trimmed by the Ack that completes
// Options.TrimEvery acks of it on this instance (default 128), and by
// [Broker.Trim]. Partition streams are trimmed by the partition consumer
// (Leases.Trim); their entries are never acked through this package.
//
// The dedupe index is kept, bounded by the trim, rather than dropped:
// Ack, Nack and Replay take a message id and need it to find the entry,
// and partition streams keep it too because the partition worker's own
// dedupe (by event global position, see docs/partitions.md) skips only
// messages with a global position, while the index also drops a relay's
// republish of any message still in its stream. Its window is the stream:
// a republish of a message that every group has acked and a trim has
// removed is appended again, which consumers absorb (partition workers by
// global position; ordinary groups are at least once anyway).
//
// A dead letter is acked by its group, so its entry may be trimmed while
// it waits in {stream}:dlq. The group's hash keeps its message id -> entry
// id (for Replay, Ack, Nack), and Replay copies the message from the DLQ
// entry into the hash, from which Next delivers it if the stream entry is
// gone; both go when the replayed message is acked, dead-lettered or
// discarded again.
//
// # Entries
//
// A message is one stream entry with the fields id, type, data, metadata,
// event_stream, category, position, global_position, time (RFC 3339,
// nanoseconds, UTC), partition_key and prev (the global position of the
// message before it on its partition stream, which the partition workers
// check for a gap); empty fields are left out. The
// stream name is the key, not a field. [Decode] fails with a
// [*DecodeError] (ErrMalformed) on anything it cannot read: a malformed
// entry is a poison message, never a panic. Next returns that error and
// leaves the entry in flight, where MessageTimeout dead-letters it; the
// group's later messages still flow.
//
// # Lua scripts, and why
//
// Every operation is one Lua script (EVALSHA, loaded on NOSCRIPT), because
// a step that spans several commands must not be seen half done by another
// host instance or lost half way by a crash:
//
//   - publish: XADD of every message of the call, each to its stream,
//     skipping an id its stream's __ids__ hash already holds, and SADD of
//     each partitioned message's key to {category}:__partitions__. The XADD
//     and the SADD in one script close Protean's publish/reap race: a
//     reaper that removes an empty partition's key from the index (SREM,
//     DEL) can never run between a publish's XADD and its SADD, so a stream
//     with entries is always indexed and its key is always discovered. Key
//     types are checked before the first write, and the #!lua shebang
//     makes an out-of-memory server refuse the script up front, so a call
//     publishes all of its messages or none.
//   - next: expire timed-out deliveries, then deliver the head of the
//     requeued line if it is due, else nothing if it is not (it holds the
//     line), else one new entry (XREADGROUP COUNT 1).
//   - batch (NextBatch): next for up to n messages in one script: the
//     due heads of the requeued line, then new entries by one XREADGROUP
//     COUNT n without BLOCK. An entry delivered before (attempts so far
//     > 0) is a redelivery and comes alone: the batch stops before it and
//     after it. The engine hands the run to the guest in one call.
//   - release (Release): an untried message of a batch goes back into the
//     requeued line at its entry-order place, due now, with its delivery
//     count taken back by one, so its next delivery has the same Attempt;
//     a nacked earlier entry ahead of it still holds the line, and the
//     released one follows it. A malformed entry in a batch ends the
//     batch: it and the entries after it are released, so the next call
//     returns its DecodeError as Next would.
//   - ack, nack, replay: check the message's state and change it in one
//     step. A nack past MaxRetries does XADD to {stream}:dlq and XACK in the
//     same script, so a dead letter is never lost between the two.
//   - dlq, stats: expire first, as the suite requires of every touch.
//
// Times are the injected clock's (broker.Options.Now), passed to the
// scripts as seconds and nanoseconds, since Lua's numbers are doubles.
// MessageTimeout is therefore judged on the in-flight set's delivery
// times, not on XPENDING's idle time (Redis's own clock): the result is
// the same in production and exact under a test clock.
//
// # Guarantees
//
// The same as the inline broker's (see package broker), across any number
// of host instances sharing the groups, plus durability as far as Redis's
// persistence goes:
//
//   - Order: each group receives a stream's messages in publish order; a
//     nacked message holds the line for its group (stream and group) until
//     it is redelivered, dead-lettered or discarded.
//   - At least once: a message is the group's until acked; a consumer that
//     dies leaves it in flight until MessageTimeout moves it to the DLQ
//     (with reason timeout) — it is not silently redelivered to another
//     consumer, as ordered processing requires.
//   - One copy per id and stream while the first copy is in the stream: a
//     relay's republish after a crash is dropped until every group has
//     acked the message and a trim has removed it (see Trimming).
//   - After a trim has removed an acked message, Ack and Nack of it
//     return broker.ErrNotDelivered (its id is forgotten); a dead letter
//     stays known until it is settled.
//   - Ack, Nack and Replay errors as the broker package defines them.
//   - Wait blocks in Redis (XREAD BLOCK on the stream and the wake stream,
//     which takes nothing) in slices of Options.BlockSlice, so a cancelled
//     context or Close ends it within one slice; a lost connection is an
//     error, never a hang.
//
// It assumes one Redis primary (or a cluster where all of a call's keys
// share a slot): the publish script spans several streams. Redis 7 or
// newer is required (script shebangs, XINFO GROUPS lag, XTRIM MINID).
package redisstream
