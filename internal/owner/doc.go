// Package owner names a host instance in the leases and locks it takes:
// the subscription and partition leases, the outbox relay's locked_by and
// the Redis consumer name. The name is readable ("{hostname}:{pid}") and
// unique to one start of a host (a random suffix from crypto/rand).
//
// Why not hostname:pid alone: in containers the pid is often 1 and
// hostnames can repeat, so two hosts would share a name and pass each
// other's ownership checks (renew or re-take each other's leases, mark
// each other's outbox rows). The fences stop double handling, but not the
// churn, and a mark "by the same owner" from another host is a lie.
//
// A restarted host is a new owner on purpose: it does not hold its
// previous life's leases or locks. A clean stop releases them; after a
// crash they lapse at their TTL (lease_ttl_ms, the outbox's
// lock_timeout), exactly as when another host takes over. Nothing relies
// on the same name across restarts: every holder check compares the
// holder with the live caller, and lapsed locks are taken by anyone.
package owner
