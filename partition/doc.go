// Package partition holds what a partition is, with no broker in it: the
// rules a partition key must pass (Protean's `sequential_by`, ADR-0028),
// the names of the streams and units derived from a key, and the types a
// partitioned consumer hands its work over in ([Batch], [Handler],
// [Subscription], [Positions]). The outbox, the unit of work and the
// PostgreSQL-only paths need these and nothing of Redis: the Redis runtime
// (leases, the consumer, operator actions, its key layout) is package
// internal/redispartition, and a test on `go list -deps` keeps Redis out
// of the packages that do not need it. docs/partitions.md is the design.
//
// # Partition keys
//
// A handler declares a field whose value partitions its stream category. The
// value is taken from the message when its outbox row is written, coerced to
// a string with [KeyString], and checked with [KeyReason] (or both at once
// with [Validate]). The rules, their order and their reason strings are
// Protean's, so operators see the same messages:
//
//  1. null or empty: "partition key is null or empty"
//  2. longer than [MaxKeyLength] characters: "partition key exceeds 255 characters (got N)"
//  3. contains ':': "partition key contains a colon"
//  4. "dlq" or the configured backfill suffix: "partition key 'K' is a reserved lane/DLQ token"
//  5. the sentinel form "__name__" (at least 4 characters):
//     "partition key 'K' uses the reserved '__name__' sentinel form"
//  6. a control character (Unicode Cc: C0, DEL, C1; a newline, a tab, NUL):
//     "partition key contains a control character"
//
// Rule 6 is beyond Protean's: a key is a segment of Redis key names, a
// column of the outbox and a line of `partitions list`, and a newline in it
// broke that table; Protean accepts such keys. A key with one that was
// stored before the rule (an outbox row, a live partition) is still
// relayed and consumed; only new messages are refused.
//
// A bad key is rejected, never routed to a default partition: that would
// silently merge unrelated keys. The colon, lane and sentinel rules exist
// because the key becomes a segment of the names below, and each of those
// rules keeps one kind of name from colliding with another.
//
// # Stream names
//
// For a category C and key K:
//
//	C:K            the partition stream            (StreamName)
//	C:K:suffix     its low-priority backfill lane  (LaneStreamName)
//	C:K:dlq        its dead-letter stream          (DLQStreamName)
//
// The Redis keys around them (the index of live keys, the wake-up stream,
// the lease keys) are package redispartition's layout.
package partition
