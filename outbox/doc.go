// Package outbox holds the transactional outbox: rows that the unit of work
// writes in the same transaction as its events and records, and that a
// relay later claims and publishes to a broker. This package is the store
// side: the [Store] seam and the seams a relay needs of a store
// ([RelayStore], [Chainer], [Republisher]), the row types, and the memory
// and PostgreSQL stores. The relay itself is the daemon's runtime
// (internal/relay).
//
// A row is added inside a transaction (the memory store's [Memory.Begin];
// a PostgreSQL store inserts in the caller's pgx.Tx) and becomes claimable
// when that transaction commits. (MessageID, TargetBroker) is unique, so a
// message is written once per broker ([ErrDuplicate]).
//
// A relay calls [Store.Claim] to lease a batch of one broker's rows. A row
// is eligible when it is pending, failed and due (next_retry_at <= now), or
// processing with an expired lock (locked_until <= now: a lock is free at
// exactly its expiry instant), and its retry count is below its max
// retries. Rows are claimed by priority, highest first, then by ID. Racing
// claimers never get the same row.
//
// Rows reach the broker in commit order per key. A row's ordering key is
// (target broker, category, partition key) whatever its priority (a key's
// rows may share a partition stream, whose workers take a message at or
// below their position as applied), or (target broker, category, stream,
// priority) for a row without a key; IDs grow with commit order within a
// category. A claim returns each key's rows in ID order among the places
// the priorities give it. A claim
// hands out each key's ready run: its active rows (pending, processing, or
// failed and waiting for a retry) in ID order up to the first one that is
// not eligible. So no two claims hold rows of one key, however many relays
// claim, and a failing row holds back the later rows of its own key and no
// others. Published and abandoned rows hold nothing back. On PostgreSQL a
// claim is one statement that walks the active-row index to its limit (it
// costs the rows it hands out, not the backlog) and re-checks its picks
// under their row locks, so a claim racing a relay's mark never takes back
// the row being marked. Before it walks, it looks at the first row of each
// key (at most 65 keys): when none can be claimed (every key's head is
// under another relay's claim, waiting for its retry, or halted) nothing
// can be, and the claim returns at once instead of walking the backlog
// behind those heads. It leases a row through its lock columns alone
// (locked_by, locked_until): the status column keeps pending or failed,
// which the store reports as processing, so that the claim is a HOT update
// that adds no index entries (the table is filled to half for the room).
//
// A store that is a [RelayLeaser] (both are) keeps, per broker, a lease
// saying which relay claims its rows, so that several hosts' relays do
// not split them; claims do not depend on it for their safety.
//
// A broker that lost its data, or restarted and may have lost its last
// writes, takes no publish until the relay has made the rows it may have
// lost pending again ([Republisher]), except the partitioned rows that
// every partition consumer group has applied by the table of consumer
// positions ([Keep]).
//
// Delivery is at least once: a relay that crashes after publishing but
// before marking leaves the row processing until its lock expires, and the
// row is then claimed and published again.
//
// On PostgreSQL a unit of work adds its rows without a statement of their
// own: [Postgres.Rider] makes them part of the statement that appends
// their events (eventstore.QueueAppend), built in the database from the
// appended rows, so the whole unit of work is one round trip.
//
// After publishing, the relay marks the row published or failed. Only the
// current lock holder may mark a row ([ErrNotOwner]): a relay whose lock
// expired and was taken over cannot overwrite its successor's work. A
// failure increments the retry count; the failure that reaches max retries
// abandons the row, keeping its last error for operators, who can requeue
// it with [Store.Retry]. The relay picks the next retry's instant (its
// backoff).
//
// Time comes from a clock injected into the store, so that tests can stand
// on the exact instant a lock expires.
//
// The conformance suite in package storetest pins all of this; every Store
// implementation runs it.
package outbox
