// Package readyourwrites is the read-your-writes wait. A client that got
// global position N from a command's answer may ask for a projection "as
// of N": Waiter.Wait blocks until the projection's handler (its consumer
// group) has handled every event of its categories at or below N. Events
// of other categories do not concern it.
//
// What "handled" means is decided against the event store, not against a
// delivery order: the group's consumers in this process report each event
// whose effects committed (Waiter.Mark), and a check walks the category's
// events above the group's watermark in the store, advancing the watermark
// across handled ones and stopping at the first that is not. So it holds
// whatever order the relay and the broker deliver in, and an event that
// is dead-lettered or held by a halted partition is never counted as
// handled (the wait runs into its bound). Within one category the store's
// commits follow global position order (MessageDB's advisory lock; the
// memory store appends under one lock), so an event cannot appear below
// the watermark after the walk has passed it.
//
// An event this process did not mark is asked of the Source that delivers
// the category, which answers from its own durable record next to its own
// storage: the partition workers (package partition) by the positions row
// of the event's unit, the event-store subscriptions (package
// subscription) by the category's positions row and its open failure
// records, and the broker consumer groups (package engine), which record
// nothing durable, by whether the event was appended before they started.
// This package knows none of them: it imports no storage and no broker
// (deps_test.go pins it).
//
// A read of one document of a projector partitioned by the document's key
// (documents_by_key) waits for that key's events alone. When the source
// can say how far the key's unit has committed (Check.KeyPosition), once
// per wait a search back from N finds the key's last event at or below N,
// then each check is one read of the unit's position; otherwise the walk
// skips the other keys' events past the first that is not handled. The
// search reads the category backward when the store can
// (eventstore.BackwardReader: pages of 16 events from N, each next 4
// times larger up to 512, of positions and payloads only) and stops at the
// first event of the key, usually the reader's own at N: one read of 16
// events and one key decoded, where the forward walk it replaces (kept for
// stores without a backward read) read 512 whole events and decoded each
// one's key, 15 % of a loaded host's CPU. Before any of it, a keyed
// wait asks the marks: a process whose deliverer applies each key's
// events in order (a partition unit, an event-store subscription) marks
// each event with its key, and a key handled here up to N or past it
// needs no read at all, the usual case of a read of one's own write on
// the host that ran its projection.
//
// A read of one's own write that comes before its projection has run (the
// usual GET right after its command) reads nothing either when this
// process runs the key's unit: the source answers the unit's position
// from its worker (LocalCheck: partition.Progress asks this process's
// partition workers), and the key's last event at or below N is the
// reader's own at N, which this process appended a moment before and
// remembers (Waiter.Appended keeps the last 1,024 events its commands
// committed). The wait then sleeps until the unit marks the event. A
// worker's position may lag the positions row only when its unit was
// lost to another process meanwhile, so such a wait polls every 50 ms as
// a safety net, and that poll reads the source; every 250 ms while the
// process hears the others' commits (below), since a new owner's commits
// are heard then. (At 50 ms, a stall of a few tens of milliseconds made
// every wait it held read its unit's row at once, and the reads queued for
// the database pool with the commands' loads.)
//
// A read of one's own write on a process that does not run the key's unit
// reads nothing either, while that process hears the other processes'
// commits (Hearing; the host listens to the positions store's
// announcements, package position): HandledElsewhere records that another
// process's unit has committed every event of a key up to a position, and
// wakes the waits on it. The wait's first check then takes nothing as
// known of the unit (no read) and sleeps until such an announcement covers
// its event, reading the unit's position at the safety poll only: every
// 250 ms when every advance is told as its key's (HearsEveryAdvance: no
// priority lanes), every 50 ms otherwise, for the events that travel a
// lane, whose advances are not. Losing the hearing wakes every wait, so
// that it checks again at once. While nothing is heard, a wait on another process's unit reads the
// unit's position at once and again after 5, 10, 20 and 40 ms, then every
// 50 ms (make load, 3 hosts: 3.3 reads of a positions row per order
// polling, 0.7 hearing). Before, each such read
// cost about three reads of the positions row and one backward read of
// the store (make load, 1 host: 2.92 and 1 per order, 10 % of the host's
// CPU and 17 % of PostgreSQL's execution time).
package readyourwrites
