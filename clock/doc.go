// Package clock is the one clock of the host's long-running components:
// what they read (Now) and what every pause, poll, backoff and heartbeat
// waits on (After). The daemon makes one, the system's, and passes it down
// to the engine, the brokers, the outbox relay, the partition and
// subscription consumers and the plugin reloader; a test passes its own to
// any of them and controls every wait the same way. A component whose
// Clock is nil uses [System].
//
// Deadlines that bound work against the wall (a guest call's timeout, a
// stop's grace) stay on real time: they protect the process from work that
// does not return, whatever a test's clock does.
package clock
