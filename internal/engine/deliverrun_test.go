package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// runEngine starts the behave module's engine delivering one run of Op
// messages, all published before Start so the consumer finds them ready,
// with a run size of batch. The broker retries maxRetries times, at once,
// then dead-letters. It returns what the handler saw, in order (message id,
// and "!" for a failure), once the run has settled.
type runOutcome struct {
	handled []string
	calls   float64
	seen    []string
	dead    []string
}

// runBroker is what deliverOps needs of a broker: a Source it publishes to
// and inspects.
type runBroker interface {
	groups.Source
	broker.Broker
	broker.Inspector
	broker.DeadLetterer
}

func deliverOps(t *testing.T, batch, maxRetries int, ops ...string) runOutcome {
	t.Helper()
	return deliverOpsOn(t, func(opts broker.Options) runBroker {
		src, err := broker.NewInline(opts)
		require.NoError(t, err)
		return src
	}, batch, maxRetries, ops...)
}

func deliverOpsOn(t *testing.T, newBroker func(broker.Options) runBroker, batch, maxRetries int, ops ...string) runOutcome {
	t.Helper()
	e, mem := partitionEngine(t)
	var mu sync.Mutex
	var handled []string
	e.opts.Handled = func(h Handled) {
		mu.Lock()
		defer mu.Unlock()
		mark := ""
		if h.Err != nil {
			mark = "!"
		}
		handled = append(handled, h.Message.ID+mark)
	}
	src := newBroker(broker.Options{Policy: delivery.Policy{MaxRetries: maxRetries, Delay: time.Millisecond, MaxDelay: time.Millisecond},
		MessageTimeout: time.Minute, EnableDLQ: true})
	t.Cleanup(func() { _ = src.Close() })
	for _, m := range opBatch(1, ops...).Messages {
		m.Stream, m.Category = "ops", "ops"
		require.NoError(t, src.Publish(context.Background(), m))
	}
	startGroups(t, e, src, groups.Options{Batch: batch})
	var out runOutcome
	testwait.For(t, "every message acked or dead-lettered", func() (bool, string) {
		st, err := src.Stats(context.Background(), "ops", "behave")
		require.NoError(t, err)
		return st.Depth == 0 && st.InFlight == 0 && st.Requeued == 0, fmt.Sprintf("%+v", st)
	})
	dl, err := src.DLQ(context.Background(), "ops", "behave")
	require.NoError(t, err)
	for _, d := range dl {
		out.dead = append(out.dead, fmt.Sprintf("%s@%d", d.ID, d.Attempts))
	}
	for _, outcome := range []string{"ok", "failed", "trap", "timeout", "output", "canceled", "no_instance"} {
		var m dto.Metric
		require.NoError(t, e.opts.Metrics.calls.WithLabelValues("behave", "behave", outcome).Write(&m))
		out.calls += m.GetCounter().GetValue()
	}
	out.seen = seen(t, mem)
	mu.Lock()
	out.handled = slices.Clone(handled)
	mu.Unlock()
	return out
}

// A run of ready messages is one guest call; a failure in its middle
// commits the messages before it, retries only the failing one (alone,
// then dead-lettered after its retries) and hands the rest to the guest
// afterwards, in order: the same messages handled in the same order with
// the same effects as one by one, in fewer calls.
func TestInlineRunIsOneCallWithPerMessageRetry(t *testing.T) {
	ops := []string{"read", "read", "transient", "read", "read"}
	requireRunWithPerMessageRetry(t, deliverOps(t, 1, 1, ops...), deliverOps(t, 0, 1, ops...))
}

// requireRunWithPerMessageRetry checks the outcomes of read, read,
// transient, read, read delivered one by one and in runs, with one retry.
func requireRunWithPerMessageRetry(t *testing.T, one, run runOutcome) {
	t.Helper()
	want := []string{"m-1", "m-2", "m-3!", "m-3!", "m-4", "m-5"}
	require.Equal(t, want, one.handled, "one by one")
	require.Equal(t, want, run.handled, "in runs")
	require.Equal(t, []string{"1", "2", "4", "5"}, one.seen)
	require.Equal(t, one.seen, run.seen)
	require.Equal(t, []string{"m-3@2"}, one.dead)
	require.Equal(t, one.dead, run.dead, "the failing message alone is charged its retries")
	require.Equal(t, 6.0, one.calls)
	require.Equal(t, 3.0, run.calls, "the run, the retry alone, the rest of the run")
}

// A call that fails as a whole (the guest traps) falls back to one by
// one, so only the message that causes it is charged a failure: with no
// retries, it alone is dead-lettered and the others commit.
func TestInlineRunThatTrapsIsRedeliveredOneByOne(t *testing.T) {
	run := deliverOps(t, 0, 0, "read", "stack", "read")
	require.Equal(t, []string{"1", "3"}, run.seen)
	require.Equal(t, []string{"m-2@1"}, run.dead)
	require.Equal(t, 4.0, run.calls, "the run, then each message alone")
}
