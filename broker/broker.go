package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/backoff"
)

func clone(m delivery.Message) delivery.Message {
	m.Data = slices.Clone(m.Data)
	m.Metadata = slices.Clone(m.Metadata)
	return m
}

// Delivery is a message handed to one consumer group. Until it is acked or
// nacked it is in flight.
type Delivery struct {
	delivery.Message
	Group string
	// Attempt is 1 on the first delivery to Group and grows by one with each
	// redelivery after a Nack. Replay starts it again at 1.
	Attempt int
	// DeliveredAt is when this attempt was handed out.
	DeliveredAt time.Time
}

// Reasons a message is dead-lettered.
const (
	// ReasonMaxRetries: nacked after its last retry.
	ReasonMaxRetries = "max_retries"
	// ReasonTimeout: in flight for longer than Options.MessageTimeout.
	ReasonTimeout = "timeout"
	// ReasonRejected: rejected by its consumer (Rejecter): its failure is
	// permanent, a retry cannot help.
	ReasonRejected = "rejected"
)

// DeadLetterFinder is a broker that finds one message in a group's
// dead-letter queue by its id, without listing the queue: what a
// read-your-writes wait asks of an event it waits for (package groups).
type DeadLetterFinder interface {
	DeadLetter(ctx context.Context, stream, group, id string) (DeadLetter, bool, error)
}

// DeadLetter is a message in a consumer group's dead-letter queue.
type DeadLetter struct {
	delivery.Message
	Group string
	// Reason is ReasonMaxRetries, ReasonTimeout or ReasonRejected.
	Reason string
	// Attempts is how many times the message had been delivered.
	Attempts int
	FailedAt time.Time
}

// Stats describes one stream as one consumer group sees it.
type Stats struct {
	// Depth counts the messages waiting for delivery to the group: never
	// delivered, plus requeued after a Nack.
	Depth int
	// Requeued counts the messages of Depth that wait for a redelivery.
	Requeued int
	// InFlight counts the messages delivered and neither acked nor nacked.
	InFlight int
	// DeadLetters counts the group's dead-letter queue for the stream.
	DeadLetters int
}

// Capability is a set of guarantees a broker advertises.
type Capability uint

// Capabilities.
const (
	// ReliableMessaging: a delivered message stays the group's until it is
	// acked; a nacked one is redelivered (at-least-once).
	ReliableMessaging Capability = 1 << iota
	// DeadLetterQueue: exhausted messages are kept for inspection and
	// replay; the broker implements [DeadLetterer].
	DeadLetterQueue
	// OrderedMessaging: each group receives a stream's messages in publish
	// order.
	OrderedMessaging
	// BlockingRead: the broker implements [Waiter].
	BlockingRead
	// StreamPartitioning: the broker carries per-key partition streams
	// ({category}:{key}) with leases, as sequential_by needs.
	StreamPartitioning
)

var capabilityNames = []string{"ReliableMessaging", "DeadLetterQueue", "OrderedMessaging", "BlockingRead", "StreamPartitioning"}

// Has reports whether c includes every capability of want.
func (c Capability) Has(want Capability) bool { return c&want == want }

// String joins the names of the capabilities in c with "|".
func (c Capability) String() string {
	var names []string
	for i, n := range capabilityNames {
		if c&(1<<i) != 0 {
			names = append(names, n)
			c &^= 1 << i
		}
	}
	if c != 0 {
		names = append(names, fmt.Sprintf("Capability(%#x)", uint(c)))
	}
	if len(names) == 0 {
		return "0"
	}
	return strings.Join(names, "|")
}

// Publisher is what the outbox relay publishes to.
type Publisher interface {
	// Publish appends msgs to their streams, all or nothing.
	Publish(ctx context.Context, msgs ...delivery.Message) error
	// Capabilities returns what the broker guarantees.
	Capabilities() Capability
}

// Consumer hands a stream's messages to consumer groups. Every group has
// its own position in every stream: each group receives each message, and
// within a group each message goes to one consumer at a time.
type Consumer interface {
	// Next delivers the group's next message of stream, or returns ErrEmpty
	// at once if none is ready.
	Next(ctx context.Context, stream, group string) (Delivery, error)
	// Ack settles a delivered message. Acking twice is not an error.
	Ack(ctx context.Context, stream, group, id string) error
	// Nack gives a delivered message back: it is redelivered later, or
	// dead-lettered once its retries are used up. Nacking twice counts once.
	Nack(ctx context.Context, stream, group, id string) error
}

// Broker is a Publisher and a Consumer with a lifetime.
type Broker interface {
	Publisher
	Consumer
	// Close ends the broker; blocked calls return ErrClosed. Closing twice
	// is not an error.
	Close() error
}

// Rejecter is a Consumer that can give up on a delivered message at once,
// whatever retries it has left: the consumer knows a retry cannot help
// (the message's failure is permanent), so the message is dead-lettered
// with ReasonRejected (or discarded without a DLQ) as a Nack past its last
// retry would be. Rejecting a message that is not in flight but not acked
// returns nil; an acked one ErrAcked, one never delivered ErrNotDelivered.
type Rejecter interface {
	Reject(ctx context.Context, stream, group, id string) error
}

// Waiter is implemented by brokers with the BlockingRead capability.
type Waiter interface {
	// Wait is Next that blocks until a message is ready, ctx is done or the
	// broker is closed.
	Wait(ctx context.Context, stream, group string) (Delivery, error)
}

// Batcher is a Consumer that hands out a run of ready messages at once,
// so a consumer can give them to its handler in one call and settle each
// on its own afterwards.
type Batcher interface {
	// NextBatch delivers up to max of the group's ready messages, in the
	// order Next would deliver them, without waiting: at least one, or
	// ErrEmpty. A redelivered message (Attempt > 1) is delivered alone:
	// never after another message of the batch, and nothing after it, so
	// a retry runs by itself.
	NextBatch(ctx context.Context, stream, group string, max int) ([]Delivery, error)
	// Release gives back a message delivered to the group that its
	// consumer did not handle (a later message of a batch whose earlier
	// one failed): it is redelivered ahead of the stream's later messages,
	// in publish order behind any earlier message awaiting its retry, with
	// the same Attempt, since it was not tried. Releasing a message that
	// is not in flight but not acked returns nil; an acked one ErrAcked,
	// one never delivered ErrNotDelivered.
	Release(ctx context.Context, stream, group, id string) error
}

// DeadLetterer is implemented by brokers with the DeadLetterQueue
// capability.
type DeadLetterer interface {
	// DLQ lists the group's dead letters of stream, oldest failure first.
	DLQ(ctx context.Context, stream, group string) ([]DeadLetter, error)
	// Replay moves a dead letter back to the head of the group's line,
	// ready at once, with its attempts reset.
	Replay(ctx context.Context, stream, group, id string) error
}

// Inspector is implemented by brokers that report Stats for metrics.
type Inspector interface {
	Stats(ctx context.Context, stream, group string) (Stats, error)
}

// Errors. Calls wrap them with the stream, group and message id; test with
// errors.Is.
var (
	// ErrClosed: the broker was closed.
	ErrClosed = errors.New("broker closed")
	// ErrEmpty: no message is ready for the group.
	ErrEmpty = errors.New("no message ready")
	// ErrInvalid: a message or an argument is malformed (empty ID, stream
	// or group).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotDelivered: Ack or Nack of a message the group never received.
	ErrNotDelivered = errors.New("message not delivered to group")
	// ErrAcked: Nack of a message the group acked.
	ErrAcked = errors.New("message already acked")
	// ErrNotInFlight: Ack of a message the group nacked, or that was
	// dead-lettered or discarded.
	ErrNotInFlight = errors.New("message not in flight")
	// ErrNotDeadLettered: Replay of a message not in the group's DLQ.
	ErrNotDeadLettered = errors.New("message not in dead-letter queue")
	// ErrEpochLost: the broker lost its data (its epoch marker is gone:
	// restarted without persistence, or failed over to a replica that did
	// not have it); it takes no publish until the marker is set again
	// (Epocher).
	ErrEpochLost = errors.New("broker lost its data")
	// ErrRestarted: the broker restarted (or failed over) since its epoch
	// marker was set, and kept the marker: what it acknowledged last
	// before that may be lost (an fsync policy other than always, a
	// replica behind its primary). It takes no publish under that epoch
	// until the marker is set again (Epocher).
	ErrRestarted = errors.New("broker restarted since its epoch was set")
)

// Epocher is implemented by a Publisher that can tell when it has lost its
// data: Publish fails with ErrEpochLost while its epoch marker is missing,
// and with ErrRestarted after a restart that kept the marker. The outbox
// relay then publishes again what the broker may have lost (everything
// within the published retention; after a restart, what went out shortly
// before the last publish) and sets a new marker.
type Epocher interface {
	// Epoch returns the marker's epoch, "" if there is none, and whether
	// the broker restarted since it was set.
	Epoch(ctx context.Context) (epoch string, restarted bool, err error)
	// SetEpoch sets the marker to epoch, on the broker as it runs now.
	SetEpoch(ctx context.Context, epoch string) error
	// PublishIn publishes only while the marker holds epoch, set since
	// the broker's last restart (else ErrEpochLost, or ErrRestarted): a
	// publisher that read the epoch before it claimed what it publishes
	// never writes it into a broker that lost its data since, even after
	// the marker was set anew, nor past writes a restart may have lost.
	PublishIn(ctx context.Context, epoch string, msgs ...delivery.Message) error
}

// Options are the delivery settings of a broker. Start from DefaultOptions.
type Options struct {
	// Policy is the one retry policy of every delivery path: a nacked
	// message gets MaxRetries redeliveries, and the nack after the last
	// one dead-letters it (0: the first nack does); redelivery n waits
	// Policy.Pause(n): Delay, doubled for each further one up to MaxDelay
	// (0: no cap), shortened by up to the Jitter fraction so that messages
	// failing together are not redelivered together.
	delivery.Policy
	// MessageTimeout is how long a message may stay in flight; after it the
	// message is dead-lettered with ReasonTimeout.
	MessageTimeout time.Duration
	// EnableDLQ keeps exhausted and timed-out messages in the group's
	// dead-letter queue; without it they are discarded.
	EnableDLQ bool
	// Clock is what the broker reads and what its retry pauses and due
	// times wait on (nil: clock.System). A test that controls time sets
	// it.
	Clock clock.Clock
	// Logger receives a warning for every dead-lettered or discarded
	// message; nil discards.
	Logger *slog.Logger
}

// DefaultOptions returns Protean's defaults for the inline broker.
func DefaultOptions() Options {
	return Options{
		Policy:         delivery.Policy{MaxRetries: 3, Delay: time.Second, MaxDelay: time.Minute},
		MessageTimeout: 300 * time.Second,
		EnableDLQ:      true,
	}
}

// Validate reports the first setting out of range.
func (o Options) Validate() error {
	switch {
	case o.MaxRetries < 0:
		return fmt.Errorf("broker: MaxRetries must be >= 0, got %d", o.MaxRetries)
	case o.Delay < 0:
		return fmt.Errorf("broker: Delay must be >= 0, got %s", o.Delay)
	case o.MaxDelay < 0:
		return fmt.Errorf("broker: MaxDelay must be >= 0, got %s", o.MaxDelay)
	case !(o.Jitter >= 0 && o.Jitter <= 1): // also NaN
		return fmt.Errorf("broker: Jitter must be in [0, 1], got %g", o.Jitter)
	case o.MessageTimeout <= 0:
		return fmt.Errorf("broker: MessageTimeout must be > 0, got %s", o.MessageTimeout)
	}
	return nil
}

// JitterFactor draws the factor a redelivery delay is multiplied by, in
// [1-Jitter, 1] (for a broker that computes the delay elsewhere, such as in
// a Redis script).
func (o Options) JitterFactor() float64 {
	return float64(backoff.Jitter(1<<30, o.Jitter, o.Rand)) / (1 << 30)
}
