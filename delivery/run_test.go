package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/position"
)

// script is a Unit whose messages fail as told: outcomes[i] lists what
// message i does on each call that reaches it ("ok" once the list is used
// up). An outcome is "fail" (its own, retryable), "perm" (its own, not
// retryable), "infra", "whole" (the whole call traps when it has other
// messages too; alone, its own failure), "fenced" or "applied".
type script struct {
	outcomes map[int][]string
	seen     map[int]int
	// goOn is GiveUp's answer; redeliver makes the unit a Redeliverer.
	goOn bool
	// covered is how many messages a Resync finds applied.
	covered int

	calls    []string // "from:to" of each Handle
	handled  []string // "from:to" of each Handled
	charged  map[int]int
	gaveUp   []int
	redeliv  []int
	settleOn error // Handled's error
}

func newScript(outcomes map[int][]string) *script {
	return &script{outcomes: outcomes, seen: map[int]int{}, charged: map[int]int{}}
}

func (s *script) next(i int) string {
	k := s.seen[i]
	s.seen[i]++
	if k < len(s.outcomes[i]) {
		return s.outcomes[i][k]
	}
	return "ok"
}

func (s *script) Handle(_ context.Context, from, to int) (int, error) {
	s.calls = append(s.calls, fmt.Sprintf("%d:%d", from, to))
	for i := from; i < to; i++ {
		if to-from > 1 && s.peek(i) == "whole" {
			s.next(i)
			return 0, delivery.MarkWhole(errors.New("trap"))
		}
	}
	for i := from; i < to; i++ {
		switch s.next(i) {
		case "ok":
			continue
		case "fail":
			return i - from, errors.New("own failure")
		case "perm", "whole":
			return i - from, kind(false)
		case "infra":
			return i - from, delivery.MarkInfrastructure(errors.New("connection refused"))
		case "fenced":
			return i - from, position.ErrFenced
		case "applied":
			return i - from, position.ErrApplied
		}
	}
	return to - from, nil
}

func (s *script) peek(i int) string {
	if k := s.seen[i]; k < len(s.outcomes[i]) {
		return s.outcomes[i][k]
	}
	return "ok"
}

func (s *script) Handled(_ context.Context, from, to int) error {
	s.handled = append(s.handled, fmt.Sprintf("%d:%d", from, to))
	return s.settleOn
}

func (s *script) Resync(context.Context, int) (int, error) { return s.covered, nil }

func (s *script) Charge(_ context.Context, i int) (int, error) {
	s.charged[i]++
	return s.charged[i], nil
}

func (s *script) GiveUp(_ context.Context, i, _ int, _ error) (bool, error) {
	s.gaveUp = append(s.gaveUp, i)
	return s.goOn, nil
}

func (s *script) Attrs(i int) []any { return []any{"message", i} }

type redelivering struct{ *script }

func (r redelivering) Redeliver(_ context.Context, i int, _ error) error {
	r.redeliv = append(r.redeliv, i)
	return nil
}

// clock records the pauses the core asks for and returns at once.
type waitClock struct{ waits []time.Duration }

func (c *waitClock) after(d time.Duration) <-chan time.Time {
	c.waits = append(c.waits, d)
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func core(clk *waitClock) *delivery.Core {
	return &delivery.Core{Policy: delivery.Policy{MaxRetries: 2, Delay: 10 * time.Millisecond, MaxDelay: 15 * time.Millisecond},
		Clock: clock.Funcs{AfterFunc: clk.after}, What: "test"}
}

// The one algorithm, step by step: each case gives what the messages of a
// run of five do and pins the calls, the settles, the charges and the
// pauses the core makes.
func TestDeliverSettlesARunByTheOnePolicy(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		outcomes map[int][]string
		goOn     bool
		covered  int

		settled int
		err     error
		calls   string
		handled string
		charged map[int]int
		gaveUp  []int
		waits   []time.Duration
	}{
		{name: "all commit in one call", settled: 5, calls: "0:5", handled: "0:5", waits: nil},
		{name: "a failure commits the messages before it; it is retried alone, then the rest together",
			outcomes: map[int][]string{2: {"fail", "fail"}}, settled: 5,
			calls: "0:5 2:3 2:3 3:5", handled: "0:2 2:3 3:5", charged: map[int]int{2: 2}, waits: []time.Duration{10 * ms, 15 * ms}},
		{name: "past max_retries (2 retries after the first attempt) it is given up; a halt ends the run",
			outcomes: map[int][]string{1: {"fail", "fail", "fail"}}, settled: 2,
			calls: "0:5 1:2 1:2", handled: "0:1", charged: map[int]int{1: 3}, gaveUp: []int{1}, waits: []time.Duration{10 * ms, 15 * ms}},
		{name: "a parked message lets the run go on", goOn: true,
			outcomes: map[int][]string{1: {"perm"}}, settled: 5,
			calls: "0:5 2:5", handled: "0:1 2:5", charged: map[int]int{1: 1}, gaveUp: []int{1}},
		{name: "a call that fails as a whole goes one message at a time; only the guilty one is charged",
			outcomes: map[int][]string{3: {"whole", "whole"}}, goOn: true, settled: 5,
			calls: "0:5 0:1 1:2 2:3 3:4 4:5", handled: "0:1 1:2 2:3 4:5", charged: map[int]int{3: 1}, gaveUp: []int{3}},
		{name: "an infrastructure failure is retried without end and never charged",
			outcomes: map[int][]string{0: {"infra", "infra", "infra", "infra", "infra"}}, settled: 5,
			calls: "0:5 0:1 0:1 0:1 0:1 0:1 1:5", handled: "0:1 1:5",
			waits: []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms}},
		{name: "a fence refused: the unit is lost, nothing more",
			outcomes: map[int][]string{2: {"fenced"}}, settled: 2, err: delivery.ErrLost, calls: "0:5", handled: "0:2"},
		{name: "a message the position covers is settled without a call",
			outcomes: map[int][]string{1: {"applied"}}, covered: 2, settled: 5, calls: "0:5 3:5", handled: "0:1 1:3 3:5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript(tc.outcomes)
			s.goOn, s.covered = tc.goOn, tc.covered
			clk := &waitClock{}
			settled, err := core(clk).Deliver(context.Background(), context.Background(), s, 5)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.settled, settled, "settled")
			require.Equal(t, tc.calls, strings.Join(s.calls, " "), "calls")
			require.Equal(t, tc.handled, strings.Join(s.handled, " "), "handled")
			if tc.charged == nil {
				tc.charged = map[int]int{}
			}
			require.Equal(t, tc.charged, s.charged, "charged")
			require.Equal(t, tc.gaveUp, s.gaveUp, "given up")
			require.Equal(t, tc.waits, clk.waits, "pauses")
		})
	}
}

// A source that redelivers (a broker) gets the failed message back
// instead of a pause; the run ends after it, the rest unsettled.
func TestDeliverHandsARetryToARedeliveringSource(t *testing.T) {
	t.Parallel()
	s := newScript(map[int][]string{1: {"fail"}})
	clk := &waitClock{}
	settled, err := core(clk).Deliver(context.Background(), context.Background(), redelivering{s}, 5)
	require.NoError(t, err)
	require.Equal(t, 2, settled)
	require.Equal(t, []int{1}, s.redeliv)
	require.Empty(t, clk.waits, "the source waits, not the core")
}

// A stop during a pause interrupts the run; a settle that fails is the
// path's own failure and ends it at what was settled.
func TestDeliverStopsAndReportsSettleFailures(t *testing.T) {
	t.Parallel()
	soft, cancel := context.WithCancel(context.Background())
	cancel()
	s := newScript(map[int][]string{0: {"fail"}})
	blocked := &delivery.Core{Policy: delivery.Policy{MaxRetries: 5, Delay: time.Hour},
		Clock: clock.Funcs{AfterFunc: func(time.Duration) <-chan time.Time { return nil }}}
	settled, err := blocked.Deliver(soft, context.Background(), s, 3)
	require.ErrorIs(t, err, delivery.ErrInterrupted)
	require.Equal(t, 0, settled)

	s = newScript(nil)
	s.settleOn = errors.New("redis: connection refused")
	settled, err = core(&waitClock{}).Deliver(context.Background(), context.Background(), s, 3)
	require.ErrorContains(t, err, "connection refused")
	require.Equal(t, 0, settled, "nothing is settled until the settle succeeds")

	s = newScript(map[int][]string{0: {"applied"}})
	_, err = core(&waitClock{}).Deliver(context.Background(), context.Background(), s, 3)
	require.ErrorContains(t, err, "does not cover", "a resync that covers nothing is an error, not a loop")
}
