// Package delivery is the one delivery algorithm of every path that hands
// messages to handlers: the broker consumer groups (inline and Redis), the
// Redis partition workers and the event-store subscriptions. They differ
// in where messages come from and how a unit is owned, and are sources
// feeding [Core.Deliver]: a run of one unit's messages goes to the
// handler in one guest call that commits, with group commit, each
// message's effects with the unit's fenced position; what committed is
// settled; a failure is classified once and settled by one policy
// (retried in place, handed back to a source that redelivers, given up by
// halting the unit, recording the message or dead-lettering it). A path
// says what those steps mean for it through a [Unit]. What the core
// decides with:
//
//   - [Class]: whose failure it is. An [Infrastructure] failure (a server
//     unreachable, restarting, loading or shutting down, a lost
//     connection, a serialization or deadlock retry, a host function's
//     store call that failed for one of these, even when the guest turned
//     it into a failure of its own) is retried without end and never
//     counts towards a halt, a park, a dead letter or an abandonment. A
//     failure of the message's own ([Retry] or [Permanent]: a trap, a
//     guest failure, effects the stores refuse, a scope or validation
//     error) is counted, and past the policy's retries the unit halts
//     (partitioned) or the message is parked (unpartitioned), visibly.
//   - [Policy]: the one retry policy. MaxRetries counts retries after the
//     first attempt (so MaxRetries = 3 is 4 attempts), and the pause
//     before retry n is Delay·2^(n-1), capped at MaxDelay, shortened by up
//     to Jitter so that messages failing together do not retry together.
//     Infrastructure failures pause from [InfraBase], doubling, at most
//     [InfraMax] (a second), so a server that comes back is used again
//     within a second of its return.
//   - [Outage]: one WARN line when a component starts failing on its
//     infrastructure and one INFO line when it recovers, instead of one
//     line per attempt, with a counter that shows every attempt.
//
// A failure that a whole guest call suffers (a trap, a timeout, running
// out of memory) on a run of several messages cannot be pinned on any one
// of them: the handler marks it ([MarkWhole]) and the core runs the rest
// of the run one message per call, so only the guilty message is charged.
//
// Errors keep their kind on the way: [MarkInfrastructure] wraps an error
// so that [Classify] reports it as infrastructure whatever wraps it
// later, which is how a host function's store failure survives the trip
// through a guest that reported its own failure.
package delivery
