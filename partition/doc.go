// Package partition implements per-key sequential processing (Protean's
// `sequential_by`, ADR-0028): the rules a partition key must pass, the names
// of the streams and keys derived from it, and (added later) the leases with
// fencing tokens that let many host instances share partitions.
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
//	C:__partitions__  the set of live keys of C    (IndexKey)
//
// The index records the base key only, never the lane.
package partition
