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
// look again every few milliseconds. While the request runs (until done,
// or until the context given to Begin ends) it renews the lease every
// third of it, so a command slower than the lease (a slow handler,
// retries) is not run again by a repeat that takes the key over; a host
// that dies mid-command stops renewing and holds the key no longer than
// the lease (the host gives its partition lease TTL, 15 s by default, as
// for every other lease: Lease is only the default). Every time on
// PostgreSQL (a lease, its renewal, a key's expiry, whether a lease has
// lapsed) is the database's clock, computed in the SQL, as for the
// subscription leases: with each host's own clock, a host whose clock ran
// ahead by more than the lease would take a key another host still held.
// We renew rather than derive the lease from the request's deadline: a command's time is not bounded (the HTTP server sets no
// deadline on a handler, and a guest may retry), and a fixed lease would
// have to outlast the slowest command, which is also how long a dead
// host's key would stay stuck. A request that stores no answer (a
// conflict, a failure of ours) deletes its pending row, so the next
// request of the key runs the command. The key's row is written in the
// command's own unit of work ([Postgres.QueueInsert], through unitofwork's
// WithIdempotency), so the command's effects and its key commit together:
// a retry after a crash between the commit and the answer finds the key
// and never applies the command twice. The full answer (with the outcome
// of follow-up commands) replaces that row's after the command returns;
// a command with no follow-ups stores its final answer in its unit of
// work, and the API saves nothing after it.
//
// Keys expire after a TTL ([http] idempotency_ttl_seconds, 24 h by
// default): an expired key is gone for a new request (Begin deletes it),
// and each claim purges a bounded number of expired rows, so the table
// does not grow without end. The memory store keeps the same rules for
// the embedded default.
package idempotency
