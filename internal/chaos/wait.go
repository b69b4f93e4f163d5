package chaos

import (
	"context"
	"fmt"
	"os"
	"time"
)

// Bounds of the harness's waits. Each is a limit, not an expectation: a
// wait returns as soon as its condition holds, and the limit is far above
// what a healthy run needs on two busy cores, so reaching it means the
// thing is not going to happen.
const (
	serverBound = 120 * time.Second // a server or host start, a restart
	exitBound   = 60 * time.Second  // a process to end after a signal
	poll        = 100 * time.Millisecond
)

// ErrTimeout is wrapped by every wait that ran out of its bound.
var ErrTimeout = fmt.Errorf("chaos: wait bound passed")

// until polls cond until it holds, ctx ends or bound passes; the error
// names what was awaited and the last state cond reported.
func until(ctx context.Context, bound time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(bound)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: not within %s: %s", ErrTimeout, what, bound, state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %s)", what, ctx.Err(), state)
		case <-t.C:
		}
	}
}

// waitDone waits for a process's done channel, for at most exitBound.
func waitDone(done <-chan struct{}, what string) error {
	select {
	case <-done:
		return nil
	case <-time.After(exitBound):
		return fmt.Errorf("%w: %s: not within %s", ErrTimeout, what, exitBound)
	}
}

// tail is the last n bytes of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log %s: %v)", path, err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// hold keeps a fault in place for d (the fault's duration, not a wait
// for something to happen), or less if ctx ends.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
