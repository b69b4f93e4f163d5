// Package brokertest is the conformance suite for broker implementations.
// Every broker (inline, Redis Streams) runs it from a test of its own,
// stating in a Features value what it guarantees:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Features{Ordered: true, ...},
//			func(t *testing.T, opts broker.Options) broker.Broker { ... })
//	}
//
// The suite uses only the interfaces of package broker, so it pins what
// callers may rely on and nothing an implementation happens to do besides.
// A feature left false skips the tests that need it; a feature claimed but
// not delivered fails them.
package brokertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
)

// Features states what a broker guarantees beyond the baseline every
// broker meets: at-least-once delivery per group, independent groups, the
// Ack and Nack contract, redelivery after Nack as Options say, and Close.
type Features struct {
	// Ordered: each group receives a stream's messages in publish order
	// (the OrderedMessaging capability).
	Ordered bool
	// HoldTheLine: a requeued message is redelivered before any later
	// message of its stream and group, and nothing later is delivered to
	// that group while it waits for its retry delay.
	HoldTheLine bool
	// DeadLetters: the broker implements broker.DeadLetterer and keeps
	// exhausted messages in the group's DLQ (the DeadLetterQueue
	// capability).
	DeadLetters bool
	// MessageTimeout: a message in flight for longer than
	// Options.MessageTimeout is dead-lettered with broker.ReasonTimeout.
	MessageTimeout bool
	// Blocking: the broker implements broker.Waiter (the BlockingRead
	// capability).
	Blocking bool
	// Stats: the broker implements broker.Inspector.
	Stats bool
	// Deduplicates: Publish drops a message whose ID its stream already
	// holds.
	Deduplicates bool
	// Clock: the broker takes the time from Options.Now and Options.After,
	// so the suite can move time with a Clock. Tests that need time to pass
	// are skipped without it.
	Clock bool
}

// NewBroker returns an empty broker, not shared with any other call, set
// up with opts. The suite closes it.
type NewBroker func(t *testing.T, opts broker.Options) broker.Broker

// Epoch is the time a test's Clock starts at.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// timeout bounds every wait for another goroutine.
const timeout = 10 * time.Second

// Run runs the suite. newBroker is called once per subtest, from parallel
// subtests.
func Run(t *testing.T, f Features, newBroker NewBroker) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"Capabilities", testCapabilities},
		{"PublishValidates", testPublishValidates},
		{"PublishHonoursContext", testPublishHonoursContext},
		{"RoundTrip", testRoundTrip},
		{"FIFOPerStream", testFIFOPerStream},
		{"EmptyAndUnknown", testEmptyAndUnknown},
		{"IndependentGroups", testIndependentGroups},
		{"GroupSharesMessages", testGroupSharesMessages},
		{"AckIdempotent", testAckIdempotent},
		{"AckErrors", testAckErrors},
		{"NackErrors", testNackErrors},
		{"NackIdempotent", testNackIdempotent},
		{"RequeueImmediate", testRequeueImmediate},
		{"RequeueBackoff", testRequeueBackoff},
		{"DeadLetterAfterMaxRetries", testDeadLetterAfterMaxRetries},
		{"RejectDeadLettersAtOnce", testRejectDeadLettersAtOnce},
		{"MaxRetriesZero", testMaxRetriesZero},
		{"DiscardWithoutDLQ", testDiscardWithoutDLQ},
		{"DeadLetterUnblocks", testDeadLetterUnblocks},
		{"InFlightTimeout", testInFlightTimeout},
		{"InFlightTimeoutWithoutDLQ", testInFlightTimeoutWithoutDLQ},
		{"Replay", testReplay},
		{"ReplayErrors", testReplayErrors},
		{"HoldTheLine", testHoldTheLine},
		{"HoldTheLineScope", testHoldTheLineScope},
		{"RequeuedInPublishOrder", testRequeuedInPublishOrder},
		{"Stats", testStats},
		{"WaitDelivers", testWaitDelivers},
		{"WaitHonoursContext", testWaitHonoursContext},
		{"WaitWakesForRetry", testWaitWakesForRetry},
		{"WaitWakesForNack", testWaitWakesForNack},
		{"Close", testClose},
		{"CloseWakesWaiters", testCloseWakesWaiters},
		{"Isolation", testIsolation},
		{"Deduplicates", testDeduplicates},
		{"Stress", testStress},
		{"CloseHammer", testCloseHammer},
		{"Batch", testBatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, &env{t: t, f: f, newBroker: newBroker})
		})
	}
}

// env is one test's view of the broker under test.
type env struct {
	t         *testing.T
	f         Features
	newBroker NewBroker
	b         broker.Broker
	clk       *Clock
}

// open creates the broker with the default options, changed by mod.
func (e *env) open(mod func(*broker.Options)) broker.Broker {
	e.t.Helper()
	e.clk = NewClock(Epoch)
	opts := broker.DefaultOptions()
	opts.Clock = e.clk
	if mod != nil {
		mod(&opts)
	}
	e.b = e.newBroker(e.t, opts)
	e.t.Cleanup(func() { _ = e.b.Close() })
	return e.b
}

// need skips the test unless the broker has all the features.
func (e *env) need(features ...bool) {
	e.t.Helper()
	for _, ok := range features {
		if !ok {
			e.t.Skip("broker does not claim a feature this test needs")
		}
	}
}

func (e *env) waiter() broker.Waiter {
	e.t.Helper()
	w, ok := e.b.(broker.Waiter)
	require.True(e.t, ok, "Features.Blocking: broker must implement broker.Waiter")
	return w
}

func (e *env) dlq() broker.DeadLetterer {
	e.t.Helper()
	d, ok := e.b.(broker.DeadLetterer)
	require.True(e.t, ok, "Features.DeadLetters: broker must implement broker.DeadLetterer")
	return d
}

func (e *env) stats(stream, group string) broker.Stats {
	e.t.Helper()
	i, ok := e.b.(broker.Inspector)
	require.True(e.t, ok, "Features.Stats: broker must implement broker.Inspector")
	s, err := i.Stats(context.Background(), stream, group)
	require.NoError(e.t, err)
	return s
}

// msg builds a message of stream with id.
func msg(stream, id string) delivery.Message {
	return delivery.Message{
		ID:     id,
		Stream: stream,
		Type:   "Tested",
		Data:   json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)),
	}
}

// publish publishes one message per id to stream, one call each.
func (e *env) publish(stream string, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		require.NoError(e.t, e.b.Publish(context.Background(), msg(stream, id)))
	}
}

// next requires the group's next message of stream to be id.
func (e *env) next(stream, group, id string) broker.Delivery {
	e.t.Helper()
	d, err := e.b.Next(context.Background(), stream, group)
	require.NoError(e.t, err, "next %s/%s: want %s", stream, group, id)
	require.Equal(e.t, id, d.ID, "next %s/%s", stream, group)
	return d
}

// empty requires no message of stream to be ready for group.
func (e *env) empty(stream, group string) {
	e.t.Helper()
	d, err := e.b.Next(context.Background(), stream, group)
	require.ErrorIs(e.t, err, broker.ErrEmpty, "next %s/%s delivered %s", stream, group, d.ID)
}

func (e *env) ack(stream, group, id string) {
	e.t.Helper()
	require.NoError(e.t, e.b.Ack(context.Background(), stream, group, id))
}

func (e *env) nack(stream, group, id string) {
	e.t.Helper()
	require.NoError(e.t, e.b.Nack(context.Background(), stream, group, id))
}

// onlyDeadLetter requires the group's DLQ of stream to hold just id, with
// reason and attempts, and returns it.
func (e *env) onlyDeadLetter(stream, group, id, reason string, attempts int) broker.DeadLetter {
	e.t.Helper()
	dl := e.deadLetters(stream, group)
	require.Len(e.t, dl, 1)
	require.Equal(e.t, id, dl[0].ID)
	require.Equal(e.t, reason, dl[0].Reason)
	require.Equal(e.t, attempts, dl[0].Attempts)
	return dl[0]
}

// deadLetters returns the ids in the group's DLQ of stream.
func (e *env) deadLetters(stream, group string) []broker.DeadLetter {
	e.t.Helper()
	dl, err := e.dlq().DLQ(context.Background(), stream, group)
	require.NoError(e.t, err)
	return dl
}

// recv receives the group's next message of stream, waiting for it.
func (e *env) recv(ctx context.Context, stream, group string) (broker.Delivery, error) {
	return receive(ctx, e.b, stream, group)
}

// receive waits with broker.Waiter if the broker has it, else polls Next.
func receive(ctx context.Context, b broker.Broker, stream, group string) (broker.Delivery, error) {
	if w, ok := b.(broker.Waiter); ok {
		return w.Wait(ctx, stream, group)
	}
	for {
		d, err := b.Next(ctx, stream, group)
		if !errors.Is(err, broker.ErrEmpty) {
			return d, err
		}
		select {
		case <-ctx.Done():
			return broker.Delivery{}, ctx.Err()
		case <-time.After(time.Millisecond): // no blocking read: poll
		}
	}
}

// result is a Wait's outcome, sent from the goroutine that waited.
type result struct {
	d   broker.Delivery
	err error
}

// waitAsync runs Wait in a goroutine; the test must receive from the
// channel before it ends.
func (e *env) waitAsync(ctx context.Context, stream, group string) <-chan result {
	w := e.waiter()
	ch := make(chan result, 1)
	go func() {
		d, err := w.Wait(ctx, stream, group)
		ch <- result{d, err}
	}()
	return ch
}

// within receives from ch, failing the test after the suite's timeout.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		require.FailNow(t, "timed out waiting for "+what)
		panic("unreachable")
	}
}

// pending requires ch to have nothing to receive yet. It cannot prove a
// goroutine will never send, only that it has not so far.
func pending[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		require.FailNow(t, fmt.Sprintf("%s returned early: %+v", what, v))
	default:
	}
}
