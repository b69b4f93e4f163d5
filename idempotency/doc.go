// Package idempotency keeps the answers of commands sent with an
// Idempotency-Key, so that a client retrying a command gets the first
// answer instead of running it again.
//
// A request is identified by its scope (the command type) and key, and
// carries the hash of its body. [Store.Begin] serialises the requests of
// one key: it waits while another request of the key is in progress (on
// any host sharing the store) and then returns the key's stored answer, if
// it has one; otherwise the caller runs the command and saves its answer
// before it calls done. So concurrent repeats run the command once and all
// get the same answer. A stored key with another body hash is
// [ErrMismatch] (the API answers 422).
//
// On PostgreSQL a request claims its key with a pending row under a lease
// ([Lease]) and holds no connection while it runs or waits; the others
// look again every few milliseconds. A host that dies mid-command holds
// the key no longer than the lease; a request that stores no answer (a
// conflict, a failure of ours) deletes its pending row, so the next
// request of the key runs the command. The key's row is written in the command's
// own unit of work ([Postgres.QueueInsert], through unitofwork's
// WithIdempotency), so the command's effects and its key commit together:
// a retry after a crash between the commit and the answer finds the key
// and never applies the command twice. The full answer (with the outcome
// of follow-up commands) replaces that row's after the command returns.
//
// Keys expire after a TTL ([http] idempotency_ttl_seconds, 24 h by
// default): an expired key is gone for a new request (Begin deletes it),
// and each Save purges a bounded number of expired rows, so the table
// does not grow without end. The memory store keeps the same rules for
// the embedded default.
package idempotency
