package partition

// Unit names and the Redis keys of a unit's lease protocol. A unit is what
// one lease covers and one consumer-positions row records: for a handler on
// a partitioned category, the partition "{category}:{key}"; for a process
// manager with sequential_by, "{pm}:{correlation value}" spanning every
// category it reads. Keys are per consumer group (a handler's name), so two
// handlers on one category own the same partition independently.

// PartitionUnit is the unit of key in category: "{category}:{key}".
func PartitionUnit(category, key string) string { return category + ":" + key }

// CorrelationUnit is the unit of a process manager's correlation value:
// "{pm}:{value}".
func CorrelationUnit(pm, value string) string { return pm + ":" + value }

// LeaseKey is the unit's lease: a string "{owner}:{generation}" with a TTL.
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

// DLQStreamName is the partition's dead-letter stream "{category}:{key}:dlq",
// where the operator's `partitions dlq` moves a halted head.
func DLQStreamName(category, key string) string { return LaneStreamName(category, key, DLQToken) }

// AuditStream records every operator action on partitions.
const AuditStream = "protean:audit"
