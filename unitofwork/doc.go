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
// The Backend seam has a memory implementation (the embedded default,
// holding the three memory stores' write locks in a fixed order) and a
// PostgreSQL one (one READ COMMITTED transaction).
package unitofwork
