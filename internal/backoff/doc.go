// Package backoff is the one exponential backoff of the host: the outbox
// relay's publish retries and a broker's redeliveries both wait
// [Delay]. Callers keep their own names and defaults for the inputs; the
// arithmetic (growth, saturation, cap, jitter) lives only here.
package backoff
