package host

import (
	"context"
	"errors"
	"fmt"
)

// What the host does on a guest's behalf is counted against the guest: a
// host function's answer is built on the host's heap, outside the guest's
// linear memory, so without a budget a module could make the host read,
// copy and hold any amount (a read_stream of 1,000 events of 270 KB each
// is 270 MB; two such calls took a host from 1.7 to 4.4 GB). Each
// protean_handle call gets a budget:
//
//   - host calls (load and read_stream, either ABI): at most MaxHostCalls;
//   - bytes answered: at most MaxHostBytes in all, and a read_stream page
//     holds at most MaxReadBytes of events (more go to the next page; an
//     event larger than that comes alone, bounded where it was written);
//   - host memory: the answer the host holds for the guest (v2 keeps it
//     until the guest takes it) is charged to the instance's memory meter,
//     the same budget as the guest's own memories (memory_mb plus twice
//     max_output_bytes), so host and guest together stay within it;
//   - time: a host function called after the call's deadline answers an
//     error without doing the work, and the stores read under the call's
//     context, so a long read is canceled at the deadline (both unless
//     the module is uninterruptible, as its own code is).
//
// A call over a count, byte or memory budget ends at once with a
// *HostLimitError naming the host function and the limit: the guest cannot
// ignore it, and the message fails as its own (it would fail again).

// ErrHostLimit is the cause of a call ended for exceeding a budget of what
// the host does on its behalf (see HostLimitError).
var ErrHostLimit = errors.New("host-function budget exceeded")

// HostLimitError is a call ended because a host function's work would
// have taken it past a budget. It matches ErrHostLimit under errors.Is.
type HostLimitError struct {
	// Function is the host function the guest called, e.g. abi.V2ReadStream.
	Function string
	// Limit is the setting that bounds it: "max_host_calls",
	// "max_host_bytes" or "memory_mb".
	Limit string
	// Used is what the call would have reached; Max is the limit.
	Used, Max int64
}

func (e *HostLimitError) Error() string {
	what := "bytes"
	switch e.Limit {
	case LimitHostCalls:
		what = "host calls"
	case LimitMemory:
		what = "bytes of host and guest memory"
	}
	return fmt.Sprintf("%v: %s: %d %s (limit %s = %d)", ErrHostLimit, e.Function, e.Used, what, e.Limit, e.Max)
}

// Unwrap returns ErrHostLimit.
func (e *HostLimitError) Unwrap() error { return ErrHostLimit }

// The limits a HostLimitError names (their keys under [plugins.limits]).
const (
	LimitHostCalls = "max_host_calls"
	LimitHostBytes = "max_host_bytes"
	LimitMemory    = "memory_mb"
)

// callBudget is one protean_handle call's budget. Host functions run on
// the goroutine of the guest call, one at a time, so it needs no lock.
type callBudget struct {
	lim   Limits
	calls int
	bytes int64
	// meter is the instance's memory meter, once the call has one; held
	// is what the host charges to it now for the guest.
	meter *memoryMeter
	held  uint64
	// inst is the call's instance, once it has one: a host call gives
	// back its turn at the cores (cores.go).
	inst *instance
}

type budgetKey struct{}

func withBudget(ctx context.Context, b *callBudget) context.Context {
	return context.WithValue(ctx, budgetKey{}, b)
}

func budgetFrom(ctx context.Context) *callBudget {
	b, _ := ctx.Value(budgetKey{}).(*callBudget)
	return b
}

// errDeadlinePassed answers a host function called after the call's
// deadline (or cancellation): the guest is about to be stopped.
var errDeadlinePassed = errors.New("the call's deadline has passed")

// enter counts a host call to fn. It ends the call (a panic wazero turns
// into the call's error) past MaxHostCalls, and returns an error to
// answer without doing the work once the call's context is done (unless
// the module is uninterruptible: a trusted module's call runs to its end,
// host functions included).
func (b *callBudget) enter(ctx context.Context, fn string) error {
	if b == nil {
		return nil
	}
	if b.inst != nil {
		b.inst.offCore()
	}
	b.calls++
	if b.calls > b.lim.MaxHostCalls {
		panic(&HostLimitError{Function: fn, Limit: LimitHostCalls, Used: int64(b.calls), Max: int64(b.lim.MaxHostCalls)})
	}
	if ctx.Err() != nil && !b.lim.Uninterruptible {
		return fmt.Errorf("%w: %w", errDeadlinePassed, context.Cause(ctx))
	}
	return nil
}

// readBytes is how many bytes of events a read_stream page may hold: the
// page size, and no more than the call has left.
func (b *callBudget) readBytes() int {
	if b == nil {
		return 0
	}
	return int(max(1, min(int64(b.lim.MaxReadBytes), int64(b.lim.MaxHostBytes)-b.bytes)))
}

// answer charges an answer of n bytes to the call, and holds it (charged
// to the instance's memory) until the next answer or the call's end; keep
// says whether the host keeps the bytes past this host call (v2: the
// answer a guest's buffer could not take). It ends the call past
// MaxHostBytes, or when host and guest memory together would pass the
// instance's budget.
func (b *callBudget) answer(fn string, n int, keep bool) {
	if b == nil {
		return
	}
	b.bytes += int64(n)
	if b.bytes > int64(b.lim.MaxHostBytes) {
		panic(&HostLimitError{Function: fn, Limit: LimitHostBytes, Used: b.bytes, Max: int64(b.lim.MaxHostBytes)})
	}
	if b.meter == nil {
		return
	}
	b.release()
	if used := b.meter.used.Add(uint64(n)); used > b.meter.budget {
		b.meter.used.Add(-uint64(n))
		panic(&HostLimitError{Function: fn, Limit: LimitMemory, Used: int64(used), Max: int64(b.meter.budget)})
	}
	b.held = uint64(n)
	if !keep {
		b.release()
	}
}

// release gives back what the host held for the guest.
func (b *callBudget) release() {
	if b == nil || b.meter == nil || b.held == 0 {
		return
	}
	b.meter.used.Add(-b.held)
	b.held = 0
}
