// Package unitofwork commits the effects of a handled message atomically.
//
// A Change is the abi.Effects a handler returned. Commit stages, in one
// Tx: record writes (aggregates, projection documents, process state), each
// guarded by its expected version; event appends, each with its expected
// stream version; and one outbox row per appended event, carrying the
// event's partition key and the target broker. Then it commits, or rolls
// everything back.
//
// For an event of a category partitioned by sequential_by, the key is read
// from the event's data, coerced to its JSON text and checked by the
// partition key rules before anything is staged: a missing or rejected key
// fails the whole unit of work with a *KeyError, and nothing is written.
// An expected-version mismatch fails it with a conflict (Conflict(err)).
//
// CommitFenced does the same and, in the same transaction, checks and
// advances a consumer's position.Fence: a partition worker or an
// event-store subscription moves its position with the effects of what it
// handled, so a message is applied once however often it is delivered,
// and an owner that lost its unit cannot commit. A failed fence
// (position.ErrFenced, position.ErrApplied) rolls the effects back.
//
// CommitRun is group commit for a consumer that handled a run of
// messages: each Step (one message's changes and fence) is atomic and the
// steps commit in order; it returns the prefix that committed and the
// first step's error.
//
// Commit groups commands, and CommitRun groups the runs of different
// callers (group commit), on a backend that pipelines (PostgreSQL): a
// caller that finds no commit of its group in flight commits at once,
// alone; callers that arrive meanwhile queue, and when it ends the queue's
// head leads the next transaction, carrying queued callers up to
// Options.GroupCommit steps (a command is one, a run one per message; 64
// by default; 1 turns grouping off). There is no timer: a lone caller
// never waits, and a batch grows with the time a commit takes. A group is
// the sorted set of categories a caller appends to, so a grouped
// transaction takes the category locks each of its callers would take
// alone. The partition workers' runs of a projector, one unit each and
// appending nothing, share one group: under load, the runs of many units
// commit in one transaction, each with its own fence. Each caller gets its
// own outcome: a group refused or failed with proof that nothing committed
// is rolled back and each member commits alone, in its own caller and
// concurrently, so one command's conflict or duplicate, or one run's
// fence, fails that caller only; ErrCommitUnknown for the group is every
// member's (never committed twice). A member whose context ends while
// queued leaves the queue with the context's error; once sent it shares
// the group's outcome, which runs under a context that ends only when
// every member's has. Options.Committed is called once per transaction.
// The memory backend commits each caller alone.
//
// Every unit of work writes its records in key order (a record's chained
// writes keep theirs) and takes its category locks after them, in
// category order: a group, or a run, that holds several commands' rows
// waits on no lock that a transaction could hold while waiting for one of
// its own, so grouping adds no lock-order deadlock.
//
// The Backend seam has a memory implementation (the embedded default,
// holding the four memory stores' write locks in a fixed order) and a
// PostgreSQL one (one READ COMMITTED transaction). On PostgreSQL a unit of
// work, or a whole run, is one round trip (package internal/pipeline):
// BEGIN, the fences, the record writes, the category locks (taken once,
// held to commit), the appends, each carrying its outbox row (built in the
// database from the appended row, in the same statement), and COMMIT, in
// one pipeline. A grouped transaction's fences are one statement for all
// its units (position.QueueAdvance), and its record writes one for all
// its first writes or one for all its updates (record.QueueWrite), not
// one a member: a group of projector runs that each update their
// document is four statements (BEGIN, fences, writes, COMMIT).
// Every refusal there (an expected version, a fence, a
// duplicate) raises, so PostgreSQL skips the rest of the pipeline, COMMIT
// included; the transaction is rolled back, and the work runs again
// through the Tx steps, one round trip each, whose errors carry their
// kind; for a run, step by step up to the failing one. Refusals are the
// rare path, so the common one pays nothing for them. A command's
// idempotency key (WithIdempotency) takes a second round trip: its answer
// holds the appended positions, so the key row and COMMIT follow them.
//
// Only a failure that proves nothing committed (the server's error, which
// skips COMMIT, or a pipeline never sent) runs the work again. When the
// connection fails after COMMIT was sent (the answer lost, the context
// cancelled on the way), the transaction may have committed: the error is
// ErrCommitUnknown and nothing runs again, since a second commit would
// append the events twice (under new ids when the guest gave none). A
// fenced consumer redelivers and its fence says whether it applied
// (position.ErrApplied); a command's caller retries with its idempotency
// key.
package unitofwork
