package partition

import (
	"errors"
	"fmt"
	"strings"
)

// Unit names and the Redis keys of a unit's lease protocol. A unit is what
// one lease covers and one consumer-positions row records: for a handler on
// a partitioned category, the partition "{category}:{key}"; for a process
// manager with sequential_by, "{pm}:{correlation value}" spanning every
// category it reads. Keys are per consumer group (a handler's name), so two
// handlers on one category own the same partition independently.

// PartitionUnit is the unit of key in category: "{category}:{key}".
func PartitionUnit(category, key string) string { return category + ":" + key }

// ErrInvalidUnit is returned by [ParseUnit] for a name that is not a
// partition unit or one of its lane streams.
var ErrInvalidUnit = errors.New("invalid partition unit")

// ParseUnit is [PartitionUnit]'s inverse: it splits "{category}:{key}" into
// its category and key. It also takes one of the unit's lane streams,
// "{category}:{key}:{backfillSuffix}" or "{category}:{key}:dlq" (an operator
// may paste a stream name), and answers that stream's unit. A key holds no
// colon ([KeyReason]) but a category may (Protean's "test::order"), so the
// key is what follows the last colon; the lane tokens are never keys, so a
// trailing one is a lane, not a key.
func ParseUnit(name, backfillSuffix string) (category, key string, err error) {
	if backfillSuffix == "" {
		backfillSuffix = DefaultBackfillSuffix
	}
	rest := name
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && (rest[i+1:] == backfillSuffix || rest[i+1:] == DLQToken) {
		rest = rest[:i]
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", "", fmt.Errorf("%w %q: want {category}:{key}", ErrInvalidUnit, name)
	}
	category, key = rest[:i], rest[i+1:]
	if category == "" {
		return "", "", fmt.Errorf("%w %q: empty category", ErrInvalidUnit, name)
	}
	if reason := KeyReason(key, backfillSuffix); reason != "" {
		return "", "", fmt.Errorf("%w %q: %s", ErrInvalidUnit, name, reason)
	}
	return category, key, nil
}

// CorrelationUnit is the unit of a process manager's correlation value:
// "{pm}:{value}".
func CorrelationUnit(pm, value string) string { return pm + ":" + value }

// LeaseKey is the unit's lease: a string "{owner}:{generation}", without a
// TTL: it holds while its owner heartbeats in HostsKey (Leases.Heartbeat).
func LeaseKey(group, unit string) string { return group + ":" + unit + ":__lease__" }

// GenerationKey is the unit's fencing counter; it is never deleted, so a
// generation is never handed out twice, even across a reap.
func GenerationKey(group, unit string) string { return group + ":" + unit + ":__generation__" }

// HaltKey is the unit's durable halt record (a hash: stream, entry, reason,
// attempts, halted_at). While it exists no instance acquires the unit.
func HaltKey(group, unit string) string { return group + ":" + unit + ":__halt__" }

// AttemptsKey counts failed attempts per entry ("{stream}/{entry id}"), so
// a retry count survives failover.
func AttemptsKey(group, unit string) string { return group + ":" + unit + ":__attempts__" }

// AcceptedKey records, per source stream, the global position up to which
// an operator has let the unit go on without messages its stream does not
// hold: a head skipped or dead-lettered (its position), or a gap resumed
// (the position the gap ends at). A worker that meets a message whose
// prev is past its position checks it before it halts on a gap.
func AcceptedKey(group, unit string) string { return group + ":" + unit + ":__accepted__" }

// DLQStreamName is the partition's dead-letter stream "{category}:{key}:dlq",
// where the operator's `partitions dlq` moves a halted head.
func DLQStreamName(category, key string) string { return LaneStreamName(category, key, DLQToken) }

// AuditStream records every operator action on partitions.
const AuditStream = "protean:audit"

// HostsKey is the sorted set of partition consumers that heartbeat: owner
// → the time (ms, Redis's clock) its heartbeat lapses. It and every
// MembersKey share the hash tag {protean}, so a heartbeat is one script
// on one slot of a cluster.
const HostsKey = "{protean}:hosts"

// MembersKey is the sorted set of the live consumers of group, as
// HostsKey: a host takes at most its fair share of the group's units
// (their count over this set's).
func MembersKey(group string) string { return "{protean}:members:" + group }
