package deliverytest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// Every published message is handed to the handler once and committed
// once, in publish order per key; messages published before the start
// (a backlog) and after it (live) alike.
func testDeliversOnceInOrder(t *testing.T, e *env) {
	keys := e.keys()
	e.publish(4, keys...)
	e.start(policy)
	e.publish(4, keys...)
	e.waitAllCommitted()
	e.requireCommittedInOrder(e.published())
	for _, names := range e.published() {
		for _, n := range names {
			require.Equal(t, 1, e.s.attemptsOf(n), "message %s handed to the handler once", n)
		}
	}
	e.requireGivenUp()
}

// A message failing on its own, MaxRetries times, is retried and commits
// on its last attempt: nothing is given up, lost or reordered.
func testRetriesOwnFailure(t *testing.T, e *env) {
	keys := e.keys()
	first := e.publish(1, keys...)
	flaky := e.publishOne(keys[0])
	e.s.failOwn(flaky, policy.MaxRetries, false)
	e.publish(2, keys...)
	e.start(policy)
	e.waitAllCommitted()
	e.requireCommittedInOrder(e.published())
	require.Equal(t, policy.MaxRetries+1, e.s.attemptsOf(flaky), "the first attempt and MaxRetries (%d) retries", policy.MaxRetries)
	require.Equal(t, 1, e.s.attemptsOf(first[keys[0]][0]), "the message before the flaky one is not handled again")
	e.requireGivenUp()
}

// A message that always fails on its own is given up after MaxRetries
// retries.
func testPoison(t *testing.T, e *env) {
	e.need(e.f.Halt || e.f.Park || e.f.DeadLetter)
	poisoned(t, e, false)
}

// A message whose failure is permanent is given up on its first attempt.
func testPermanent(t *testing.T, e *env) {
	e.need(e.f.Halt || e.f.Park || e.f.DeadLetter)
	poisoned(t, e, true)
}

// poisoned publishes a poison message on the first key between two good
// ones, and good messages on the other keys, and checks it is given up as
// the features say.
func poisoned(t *testing.T, e *env, permanent bool) {
	keys := e.keys()
	bad := keys[0]
	before := e.publish(1, keys...)
	poison := e.publishOne(bad)
	e.s.failOwn(poison, -1, permanent)
	e.publish(1, keys...)
	e.start(policy)
	e.waitGivenUp(poison)
	want := e.published()
	if e.f.Halt {
		want[bad] = before[bad] // halted: the key's later messages are not delivered
	} else {
		want[bad] = remove(want[bad], poison) // parked, dead-lettered: the key goes on past it
	}
	var flowing []string
	for _, names := range want {
		flowing = append(flowing, names...)
	}
	e.waitCommitted("the messages not behind the poison committed", flowing...)

	// The source goes on: a message published now to every key is
	// delivered, except behind a halt.
	after := e.publish(1, keys...)
	for _, k := range keys {
		if k != bad || !e.f.Halt {
			want[k] = append(want[k], after[k]...)
		}
	}
	flowing = flowing[:0]
	for _, names := range want {
		flowing = append(flowing, names...)
	}
	e.waitCommitted("the messages published after the poison was given up committed", flowing...)
	e.requireCommittedInOrder(want)
	attempts := policy.MaxRetries + 1
	if permanent {
		attempts = 1
	}
	require.Equal(t, attempts, e.s.attemptsOf(poison), "attempts of the poison message (permanent %v, MaxRetries %d)", permanent, policy.MaxRetries)
	if e.f.Halt {
		for _, n := range e.published()[bad] {
			if n != poison && !slices.Contains(before[bad], n) {
				require.Zero(t, e.s.attemptsOf(n), "message %s is behind the halt: never handed to the handler", n)
			}
		}
	}
	e.requireGivenUp(poison)
}

// Infrastructure failures are retried without end and never charged: a
// message failing on them more than MaxRetries times, then succeeding, is
// not given up, and nothing is lost or reordered.
func testInfrastructure(t *testing.T, e *env) {
	keys := e.keys()
	e.publish(1, keys...)
	down := e.publishOne(keys[0])
	// Past MaxRetries (1), but few: the infrastructure pauses grow from
	// delivery.InfraBase (50 ms, 100 ms, 200 ms).
	p := policy
	p.MaxRetries = 1
	const failures = 3
	e.s.failInfra(down, failures)
	e.publish(2, keys...)
	e.start(p)
	e.waitAllCommitted()
	e.requireCommittedInOrder(e.published())
	require.Equal(t, failures+1, e.s.attemptsOf(down), "retried past MaxRetries (%d), uncharged", p.MaxRetries)
	e.requireGivenUp()
}

// Stop with a handler call in flight lets the call return and its commit
// count, then returns; no call starts after it; a restart resumes after
// what committed (none of it is handed to the handler again), with
// nothing lost or committed twice.
func testStop(t *testing.T, e *env) {
	keys := e.keys()
	e.publish(3, keys...)

	// The first call waits, in flight, until the test releases it.
	inFlight := make(chan delivery.Batch, 1)
	release := make(chan struct{})
	var releaseOnce, first sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	e.s.setGate(func(ctx context.Context, b delivery.Batch) {
		gated := false
		first.Do(func() { gated = true })
		if !gated {
			return
		}
		inFlight <- b
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	stop := e.start(policy)
	b := testwait.Recv(t, "a handler call in flight", inFlight)

	// When Stop returns, no handler call may be in flight.
	type stopped struct {
		err    error
		active int
	}
	stopDone := make(chan stopped, 1)
	go func() {
		err := stop()
		stopDone <- stopped{err, e.s.activeCount()}
	}()
	// A source that does not wait for the call in flight returns from
	// Stop now: the window gives it the chance to show it.
	var res stopped
	returned := false
	select {
	case res = <-stopDone:
		returned = true
	case <-time.After(window):
	}
	releaseAll()
	if !returned {
		res = testwait.Recv(t, "Stop returns once the call in flight returned", stopDone)
	}
	require.Zero(t, res.active, "Stop returned with handler calls in flight")
	require.NoError(t, res.err, "a soft stop within its deadline")
	e.s.setClosed(true)
	for _, m := range b.Messages {
		n := e.s.nameOfHanded(m)
		require.True(t, e.s.isCommitted(n), "message %s of the call in flight at Stop committed", n)
	}
	attempts := map[string]int{}
	for _, names := range e.s.committedByKey() {
		for _, n := range names {
			attempts[n] = e.s.attemptsOf(n)
		}
	}
	calls := e.s.callCount()

	// Stopped: messages published now wait for the next run, and no call
	// starts meanwhile.
	e.publish(2, keys...)
	time.Sleep(window) // the chance for a call after Stop to show; not an assertion on time
	require.Equal(t, calls, e.s.callCount(), "no handler call starts after Stop returned")
	e.requireNoViolations()

	e.s.setClosed(false)
	e.start(policy)
	e.waitAllCommitted()
	e.requireCommittedInOrder(e.published())
	for n, a := range attempts {
		require.Equal(t, a, e.s.attemptsOf(n), "message %s committed before the stop: the restart resumes after it", n)
	}
	e.requireGivenUp()
}

func remove(ids []string, id string) []string {
	var out []string
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}
