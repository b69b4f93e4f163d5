// Package pgstore is the base of the PostgreSQL stores that read time
// from an injected clock, the outbox's and the consumer positions': what
// each holds ([Store]: the pool its own statements run on and its clock)
// and what its view inside a caller's transaction holds ([Tx]: that
// transaction and the same clock).
//
// Time is the clock's, recorded as package dbtime records it and passed
// to every statement, never the database's now(), so that a store and its
// memory twin answer the same times to the conformance suites and a test
// can move time without waiting for it.
//
// A store keeps its base in an unexported field rather than embedding it,
// so that the base's fields stay out of the store's exported API.
package pgstore
