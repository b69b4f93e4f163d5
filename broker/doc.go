// Package broker is the seam between the outbox relay and the consumers of
// messages, and holds the inline broker of the embedded setup.
//
// # The seam
//
// The relay publishes through a [Publisher]; consumers pull through a
// [Consumer]: Next, then Ack or Nack. A consumer group has its own position
// in every stream, so each group receives each message; within a group a
// message goes to one consumer at a time. Abilities not every broker has
// are separate interfaces, found with a type assertion and advertised in
// [Capability]: [Waiter] (blocking reads, BlockingRead), [DeadLetterer]
// (dead-letter inspection and replay, DeadLetterQueue), [Inspector]
// (counts for metrics) and [Batcher] (a run of ready messages at once,
// and Release for the ones a consumer took but did not try, so a batch
// keeps each message's retries and order; the inline broker and the
// Redis broker's ordinary groups have it). [Options] carry the delivery settings, with
// Protean's defaults in [DefaultOptions]. Package brokertest is the suite
// every implementation passes, with a Features value saying what it
// guarantees; a Redis Streams broker goes behind the same interfaces.
//
// A message is addressed by stream, group and ID in Ack, Nack and Replay,
// not by delivery: a late Nack for an attempt that was already redelivered
// counts against the redelivery. A handler that acks or nacks only what it
// received, once, never meets this.
//
// # The inline broker
//
// [Inline] keeps streams in memory in one process; it is what the embedded
// setup (make run) uses. It follows Protean's inline broker (capabilities
// ReliableMessaging and DeadLetterQueue, the same defaults) and promises
// more, each pinned by the conformance suite:
//
//   - Order. Each group receives a stream's messages in publish order
//     (OrderedMessaging; Protean's inline broker does this but does not
//     advertise it).
//   - Hold the line. A nacked message is requeued for its group and is
//     delivered again before any later message of its stream, and while it
//     waits out its retry delay (Delay * 2^(retries-1), at most MaxDelay:
//     1 s, 2 s, 4 s by default) nothing later of that stream is delivered
//     to that group. Protean does not promise this. A consumer that takes
//     one message at a time and acks or nacks it before the next thus sees
//     its stream in publish order, retries included, dead letters aside. Other streams and other groups are not held. Requeued
//     messages go out in publish order among themselves.
//   - Dead letters. The nack after MaxRetries retries (the 1+MaxRetries-th
//     delivery) moves the message to the group's dead-letter queue with
//     reason "max_retries"; a consumer that knows a retry cannot help
//     rejects it there at once (Rejecter, reason "rejected"); a message in flight for longer than
//     MessageTimeout moves there with reason "timeout" the next time the
//     group's stream is touched (Next, Wait, Ack, Nack, Replay, DLQ or
//     Stats), so an Ack that comes too late fails with ErrNotInFlight.
//     A dead letter no longer holds the line. Replay puts it back ahead of
//     every message not yet delivered, ready at once, with its attempts
//     reset. Without EnableDLQ such messages are discarded.
//   - Ack and Nack. Acking twice and nacking twice are no-ops; acking or
//     nacking a message the group never received is ErrNotDelivered;
//     nacking an acked one ErrAcked; acking one that was nacked or
//     dead-lettered ErrNotInFlight.
//   - One copy per ID. Publish is all or nothing, and drops a message
//     whose ID its stream already holds, so a relay that republishes after
//     a crash does not deliver twice.
//   - Blocking reads. Wait blocks without polling until a message is ready
//     (woken by publish, nack and replay, or by a timer for a held line),
//     ctx is done, or Close, which wakes every waiter with ErrClosed.
//
// What it does not promise:
//
//   - Durability. Nothing survives the process, and every message is kept
//     for the life of the process, as the memory event store keeps every
//     event. It suits the embedded setup and tests, not production.
//   - Processing order with several consumers in one group. Delivery order
//     is publish order, but consumers that hold several messages in flight
//     may finish them in any order; messages delivered before a nack are
//     not recalled. Per-key sequential processing across consumers is the
//     partitioned consumer's job (package partition); the inline broker is
//     exempt from the StreamPartitioning check because one ordered,
//     in-process consumer already processes every key in order.
//   - Exactly-once. Delivery is at-least-once: a nacked message is
//     delivered again, and effects must be idempotent or fenced upstream.
package broker
