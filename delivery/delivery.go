package delivery

import (
	"context"
	"errors"
	"time"

	"github.com/proteanhq/protean-host/internal/backoff"
)

// Class says whose failure an error is, and whether a retry can help.
type Class int

const (
	// Infrastructure: not the message's fault. Retried without end.
	Infrastructure Class = iota
	// Retry: the message's own failure; a retry may succeed.
	Retry
	// Permanent: the message's own failure; a retry cannot help.
	Permanent
)

func (c Class) String() string {
	switch c {
	case Infrastructure:
		return "infrastructure"
	case Retry:
		return "retry"
	case Permanent:
		return "permanent"
	}
	return "unknown"
}

// Message reports whether the failure is the message's own (it counts).
func (c Class) Message() bool { return c != Infrastructure }

// infraError marks its cause as an infrastructure failure.
type infraError struct{ err error }

func (e *infraError) Error() string { return e.err.Error() }
func (e *infraError) Unwrap() error { return e.err }

// MarkInfrastructure returns err marked as an infrastructure failure:
// [Classify] reports it, and anything that wraps it, as [Infrastructure].
// nil stays nil.
func MarkInfrastructure(err error) error {
	if err == nil || IsInfrastructure(err) {
		return err
	}
	return &infraError{err: err}
}

// IsInfrastructure reports whether err was marked by [MarkInfrastructure].
func IsInfrastructure(err error) bool {
	var ie *infraError
	return errors.As(err, &ie)
}

// Retryable is implemented by errors of the message's own that say
// whether a retry can help (engine.HandlerError).
type Retryable interface{ Retryable() bool }

// Classify is the classification a path uses when its owner gives it
// none: marked infrastructure and context errors are [Infrastructure]; an
// error that says whether a retry can help ([Retryable]) is the message's
// own; anything else is the message's own and retryable. The engine's
// classification (engine.Classify) knows its stores' errors too.
func Classify(err error) Class {
	if IsInfrastructure(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Infrastructure
	}
	var r Retryable
	if errors.As(err, &r) && !r.Retryable() {
		return Permanent
	}
	return Retry
}

// The pauses after consecutive infrastructure failures: the first, and at
// most. InfraMax stays well below a lease TTL: a server that is back is
// used again within a second, so an outage stalls nothing for much longer
// than it lasts. An attempt on a server that is down costs a refused dial
// or one failed command, never a claim (see the outbox relay, internal/relay).
const (
	InfraBase = 50 * time.Millisecond
	InfraMax  = time.Second
)

// DefaultJitter is the jitter of the retry policy the config sets.
const DefaultJitter = 0.2

// Policy is the one retry policy of every delivery path.
type Policy struct {
	// MaxRetries is how many times a failing message is retried after its
	// first attempt before it halts its unit or is parked.
	MaxRetries int
	// Delay is the pause before the first retry; each further one doubles
	// it, up to MaxDelay (<= 0: no cap).
	Delay, MaxDelay time.Duration
	// Jitter shortens each pause by up to this fraction (0 to 1).
	Jitter float64
	// Rand returns a number in [0, 1) for the jitter; nil is math/rand/v2.
	Rand func() float64
}

// BackoffFactor is how much longer each retry's pause is than the one
// before (up to the policy's MaxDelay).
const BackoffFactor = 2

// Pause is the wait before retry n (1-based) of a message that failed on
// its own.
func (p Policy) Pause(n int) time.Duration {
	return backoff.Delay(n, p.Delay, BackoffFactor, p.MaxDelay, p.Jitter, p.Rand)
}

// InfraPause is the wait after the n-th consecutive infrastructure
// failure (1-based): from InfraBase, doubling, at most InfraMax, with the
// policy's jitter.
func (p Policy) InfraPause(n int) time.Duration {
	return backoff.Delay(n, InfraBase, 2, InfraMax, p.Jitter, p.Rand)
}

// GiveUp reports whether a message that has now failed failures times on
// its own (1-based) with class is past its retries: a permanent failure
// at once, a retryable one once it has had MaxRetries retries.
// Infrastructure failures never give up.
func (p Policy) GiveUp(class Class, failures int) bool {
	switch class {
	case Infrastructure:
		return false
	case Permanent:
		return true
	}
	return failures > p.MaxRetries
}
