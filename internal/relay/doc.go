// Package relay is the outbox relay: it moves the rows of an outbox store
// (outbox.RelayStore, which the memory and PostgreSQL stores of package
// outbox implement) to a broker. A pass claims a batch of one broker's
// rows, publishes them outside any transaction, then marks them published,
// or failed with a backoff ([Backoff]), or halted or abandoned past their
// retries. Package outbox says what a claim hands out and in what order;
// this package is what the daemon runs on it.
//
// In the background loop, which starts the next pass at once after a
// clean one that claimed rows, a store that can (outbox.MarkingClaimer:
// PostgreSQL) marks a clean pass's published rows with the next pass's
// claim, in one round trip: a pass is two round trips to the database
// and one to the broker, not three and one. The claim sees the marks, so
// a key's next rows go out in that pass. What a stop leaves unmarked is
// marked on the way out. [Relay.RunOnce] marks its own rows before it
// returns.
//
// A pass sends its whole claim to the broker in one call, in claim order
// (the Redis publish script is all or nothing), and falls back to one row
// at a time only when the broker refuses one of them as invalid, to charge
// that row alone. A broker that is down or restarting fails the pass as
// infrastructure: its rows are released untried and uncounted.
//
// A broker that lost its data, or restarted and may have lost its last
// writes, takes no publish until the relay has made the rows it may have
// lost pending again (outbox.Republisher), except the partitioned rows
// that every partition consumer group has applied by the table of
// consumer positions (outbox.Keep, from [Options.Partitions]).
//
// With [Options.LeaseFor], only the relay that holds its broker's relay
// lease (outbox.RelayLeaser) claims: the relays of several hosts do not
// split one broker's rows between them, which made each claim take a
// share of the rows and multiplied the claims and marks by the hosts.
// A relay without the lease wakes the holder when its host commits
// (Notify; outbox.RelayWaker: a PostgreSQL notification, which only the
// holder listens for), so the rows of every host go out at once, not at
// the holder's next tick. The holder
// renews the lease every LeaseFor/3 and the others try for it every
// LeaseFor/5, so a holder that dies stalls the rows at most about
// 1.2 LeaseFor; one that stops gives it up on the way out. The lease is
// an economy, not a guard: relays that both believe they hold it (a
// holder paused past its lease) claim as racing relays do, safely.
//
// Delivery is at least once: a relay that crashes after publishing but
// before marking leaves the row processing until its lock expires, and the
// row is then claimed and published again. A relay that is alive but whose
// mark or release failed on the database keeps those rows and records
// them first on its next pass, so their keys do not wait for the lock.
//
// After publishing, the relay marks the row published or failed. Only the
// current lock holder may mark a row (outbox.ErrNotOwner): a relay whose
// lock expired and was taken over cannot overwrite its successor's work.
// A failure increments the retry count; [Backoff] computes the next retry
// delay.
//
// [Relay.Start] runs passes in the background; [Relay.Stop] ends them in
// two phases. Soft: no new pass starts and the pass in progress runs to
// its end, and its rows are marked. Hard, at Stop's deadline: the pass is
// canceled (rows it published but did not mark stay claimed until their
// lock expires and are published again: at least once) and Stop returns
// the deadline's error within [StopGrace].
//
// Time comes from the clock in [Options] (claim locks, backoff,
// retention), so that tests can stand on the exact instant a lock expires.
package relay
