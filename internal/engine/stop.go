package engine

import (
	"context"
	"errors"

	"github.com/proteanhq/protean-host/internal/lifecycle"
)

// StopGrace is how long Stop waits, once its deadline has canceled the
// work in progress, for that work to return before it gives up on it.
const StopGrace = lifecycle.Grace

// ErrAbandoned: Stop's deadline passed and, StopGrace after canceling it,
// work was still running (a guest call of an uninterruptible module
// cannot be canceled). Stop returned without it; see Stop.
var ErrAbandoned = lifecycle.ErrAbandoned

// Stop stops the engine in two phases. The delivery sources that hand it
// runs (the broker groups, the partition workers, the event-store
// subscriptions) are stopped first, by their own Stop.
//
// Soft: new commands are refused (ErrStopped); commands in flight and the
// runs a source still hands over run to their end and commit. Then the
// running set and every retired set still closing are closed, and Stop
// returns nil.
//
// Hard, if ctx ends first: the engine's own context, under which every
// guest call and commit runs (whatever the caller's context), is
// canceled, so interruptible calls and commits return at once and commit
// nothing (a canceled message is redelivered later; a canceled command
// answers an error). Stop then waits at most StopGrace for them and
// returns ctx's error. A call that cannot be canceled (a module with
// interruptible = false, spinning in guest code) is not waited for: Stop
// returns ErrAbandoned (wrapping ctx's error) and the call goes on in the
// background; when it returns, its result is discarded (its commit fails
// on the canceled context), and its set is closed after it. Done reports
// when that has happened; a process that exits instead simply ends it.
//
// A second Stop is a no-op that returns nil.
func (e *Engine) Stop(ctx context.Context) error {
	first := false
	e.stopOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	close(e.stopped)
	drained := e.commands.close()
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	// The finisher owns the end of the engine: it waits for the commands,
	// retires the last set (whose calls in flight it waits for), waits for
	// every set to close, and closes done. Stop waits for it, unless it
	// abandons.
	go func() {
		<-drained
		e.retire(e.loaded.Load())
		e.retiring.Wait()
		e.cancelWork() // releases the context's resources
		close(e.done)
	}()
	err := lifecycle.Wait(ctx, e.done, e.cancelWork)
	if errors.Is(err, ErrAbandoned) {
		e.log.Warn("engine stop: work still running past the deadline; not waiting for it", "grace", StopGrace)
	}
	return err
}

// Done returns a channel closed once a stopped engine has nothing left
// running and has closed every module set it owned: at Stop's return,
// unless Stop returned ErrAbandoned, then when the abandoned work returns.
func (e *Engine) Done() <-chan struct{} { return e.done }
