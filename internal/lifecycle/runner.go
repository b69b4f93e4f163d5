package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// ErrStarted: Start on a Runner that is running. ErrStopped: Start on a
// Runner that was stopped; a Runner starts once.
var (
	ErrStarted = errors.New("already started")
	ErrStopped = errors.New("stopped")
)

// Runner is the start/stop base of a long-running component (the outbox
// relay, the partition consumer, the event-store subscription consumer,
// the plugin reloader), so that start and stop mean the same for each:
//
//   - Start runs the component's loop in a goroutine on two contexts that
//     keep the caller's values and not its cancellation: soft, which Stop
//     ends (take no new work), and work, which only Stop's deadline ends
//     (cancel the work in hand). A Runner starts once: a second Start is
//     ErrStarted, a Start after Stop ErrStopped.
//   - Stop ends soft and waits for the loop to return; if its ctx ends
//     first it cancels work and waits at most Grace more (Wait). It
//     returns nil, or ctx's error (wrapped with ErrAbandoned, and logged,
//     when work still runs past the grace: it is left behind). Stop before Start, and a second Stop, are
//     no-ops.
//
// The zero Runner is ready to use; Name and Log, when set, name it in its
// errors and its warning.
type Runner struct {
	Name string
	Log  *slog.Logger

	mu      sync.Mutex
	started bool
	stopped bool
	stop    context.CancelFunc
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start runs loop(soft, work) in a goroutine (see Runner).
func (r *Runner) Start(ctx context.Context, loop func(soft, work context.Context)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopped:
		return fmt.Errorf("%s: %w", r.Name, ErrStopped)
	case r.started:
		return fmt.Errorf("%s: %w", r.Name, ErrStarted)
	}
	base := context.WithoutCancel(ctx)
	soft, stop := context.WithCancel(base)
	work, cancel := context.WithCancel(base)
	r.started, r.stop, r.cancel, r.done = true, stop, cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		loop(soft, work)
	}()
	return nil
}

// Stop stops the loop in two phases (see Runner).
func (r *Runner) Stop(ctx context.Context) error {
	r.mu.Lock()
	if r.stopped || !r.started {
		r.stopped = true
		r.mu.Unlock()
		return nil
	}
	r.stopped = true
	stop, cancel, done := r.stop, r.cancel, r.done
	r.mu.Unlock()
	stop()
	defer cancel()
	err := Wait(ctx, done, cancel)
	if errors.Is(err, ErrAbandoned) && r.Log != nil {
		r.Log.Warn(r.Name+" stop: work still running after cancel; not waiting for it", "grace", Grace)
	}
	return err
}

// Running reports whether the loop was started and has not been stopped.
func (r *Runner) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started && !r.stopped
}
