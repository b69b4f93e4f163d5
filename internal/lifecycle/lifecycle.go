// Package lifecycle is the start and the two-phase stop shared by every
// long-running component: each first stops taking new work and waits for
// the work in hand (soft), and at its Stop context's deadline cancels that
// work on a context it owns and waits a short grace for it to return
// (hard). [Runner] is the whole of it for the components that are one loop
// (the outbox relay, the partition consumer, the event-store subscription
// consumer, the plugin reloader); the engine, whose consumers come and go
// with reloads and whose stop also drains commands and closes module sets,
// uses [Wait], the hard phase alone.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Grace is how long a stop waits, once its deadline has canceled the work
// in progress, for that work to return before it gives up on it.
const Grace = 250 * time.Millisecond

// ErrAbandoned: a stop's deadline passed and, Grace after canceling it,
// work was still running (a guest call of an uninterruptible module cannot
// be canceled). The stop returned without it.
var ErrAbandoned = errors.New("work still running past the stop deadline")

// Wait waits for done. If ctx ends first, it calls cancel and waits at
// most Grace more. It returns nil if done closed before ctx ended, ctx's
// error if done closed within the grace, and ErrAbandoned wrapping ctx's
// error if it did not.
func Wait(ctx context.Context, done <-chan struct{}, cancel func()) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	cancel()
	grace := time.NewTimer(Grace)
	defer grace.Stop()
	select {
	case <-done:
		return ctx.Err()
	case <-grace.C:
		return fmt.Errorf("%w: %w", ErrAbandoned, ctx.Err())
	}
}
