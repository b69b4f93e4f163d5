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

// UnitOf is the unit that handles key's events of category for group: the
// partition ([PartitionUnit]), or, for a correlated process manager (one
// unit per correlation value across its categories), the value's
// ([CorrelationUnit]).
func UnitOf(group, category, key string, correlated bool) string {
	if correlated {
		return CorrelationUnit(group, key)
	}
	return PartitionUnit(category, key)
}

// DLQStreamName is the partition's dead-letter stream "{category}:{key}:dlq",
// where the operator's `partitions dlq` moves a halted head.
func DLQStreamName(category, key string) string { return LaneStreamName(category, key, DLQToken) }
