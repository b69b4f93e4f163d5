// Package pglisten holds a connection of its own LISTENing on PostgreSQL
// notification channels, and connects again when it is lost: Listen for
// one channel and one caller, Listener for a process's channels and their
// subscribers over one connection (PostgreSQL wakes every listening
// session of a database at each notification, whatever its channel).
// PostgreSQL delivers a notification when, and only when, the transaction
// that sent it commits, in commit order; what is sent while the listener
// is away is not delivered, so a listener is a hint that its users back
// with a poll of their own (package position's advances, the outbox
// relay's wake-ups).
package pglisten
