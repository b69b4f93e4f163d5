package redispartition

// The Redis key layout of partitions: what the broker's publish script and
// the lease protocol name. The pure names a key gives (its stream, its
// lanes, its unit) are package partition's.

// indexSentinel names the per-category set of live keys.
const indexSentinel = "__partitions__"

// IndexKey is the set of live partition keys of category:
// "{category}:__partitions__".
func IndexKey(category string) string {
	return category + ":" + indexSentinel
}

// WakeKey is the wake-up stream of category: "{category}:__wake__". Each
// publish to the category's partitions adds one entry whose field names
// are the keys it published to (value "1"); consumers block on it (XREAD)
// instead of polling their partitions. A host that hands units over to
// the others (fair share) adds an entry naming their keys with the value
// "r" (released), so a successor acquires them at once. It is a sentinel-form name, so no key's stream
// can take it.
func WakeKey(category string) string {
	return category + ":" + wakeSentinel
}

// WakeMaxLen is about how many entries a category's wake-up stream keeps
// (XADD MAXLEN ~): far more than a listener falls behind by between two
// reads; one that falls further behind notices and wakes every worker.
const WakeMaxLen = 10000

// wakeSentinel names the per-category wake-up stream.
const wakeSentinel = "__wake__"

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
