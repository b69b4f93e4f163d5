package subscription

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/lifecycle"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// Reader is the part of an event store a subscription reads.
type Reader interface {
	ReadCategory(ctx context.Context, category string, fromGlobal int64, limit int) ([]eventstore.Event, error)
	ReadAll(ctx context.Context, fromGlobal int64, limit int) ([]eventstore.Event, error)
}

// Positions is the consumer-positions store an owner claims its unit in.
type Positions = partition.Positions

// MessageError is implemented by errors that are the message's own
// failure and say whether a retry may help (engine.HandlerError). It is
// the default of Options.Classify.
type MessageError interface{ Retryable() bool }

func classifyDefault(err error) delivery.Class {
	var me MessageError
	if !errors.As(err, &me) || delivery.IsInfrastructure(err) {
		return delivery.Infrastructure
	}
	if me.Retryable() {
		return delivery.Retry
	}
	return delivery.Permanent
}

// Defaults.
const (
	DefaultBatchSize  = 100
	DefaultPoll       = 100 * time.Millisecond
	DefaultGapTimeout = 5 * time.Second
	DefaultLeaseTTL   = 15 * time.Second
	// DefaultKeyWorkers: per-key workers pay with a WASM handler on 2
	// cores (engine.BenchmarkEventStoreSubscriptionWASM: ~2x with 2), not
	// with a trivial one (more commits per batch).
	DefaultKeyWorkers = 2
)

// Options configure a Consumer. Events, Positions, Leases, Failures,
// Handler, Skip, Subscriptions and Owner are required.
type Options struct {
	Events    Reader
	Positions Positions
	Leases    Leases
	Failures  Failures
	// Handler handles a batch and commits each message's effects with the
	// position (engine.Handler()).
	Handler delivery.Handler
	// Skip commits a fence alone: the low-water mark of per-key workers
	// (unitofwork.CommitFenced with no changes). A message recorded as
	// failed or held moves the position with its record instead
	// (Failures.Park).
	Skip func(ctx context.Context, f position.Fence) error
	// Subscriptions lists what to run; called on every pass, so a reload
	// takes effect at the next one.
	Subscriptions func() []Subscription
	// Key returns the partition key of a message's data under field (a
	// Subscription's KeyField; "" if the data has none).
	Key func(field string, data json.RawMessage) string
	// Head returns the head global position of a category (or All), for
	// the lag metric; nil reports no lag.
	Head func(ctx context.Context, category string) (int64, error)
	// Classify says whether a handler error is the message's own failure
	// (it counts against the retry policy, and a retry is tried only if
	// it may help) or infrastructure (a lost connection, a failed commit:
	// retried with backoff without end, never skipping the message). Nil
	// means MessageError. engine.Classify is the engine's.
	Classify func(err error) delivery.Class
	// Owner names this host in the leases.
	Owner string
	// LeaseTTL is how long a lease outlives its last renewal; Heartbeat
	// (default LeaseTTL/5) how often leases are renewed and free units
	// tried.
	LeaseTTL, Heartbeat time.Duration
	// Poll is a caught-up worker's wait for new events when nothing wakes
	// it (Notify); BatchSize the events read at once.
	Poll      time.Duration
	BatchSize int
	// GapTimeout is how long a $all subscription holds at a gap in global
	// positions before it abandons it.
	GapTimeout time.Duration
	// KeyWorkers is how many key slots of a partitioned subscription run
	// in parallel inside its one lease (each key stays in order; see
	// keys.go); 1 or less handles the category sequentially.
	KeyWorkers int
	// Retry is the retry policy: a message failing on its own is retried
	// Retry.MaxRetries times after its first attempt, then recorded as
	// failed.
	Retry   delivery.Policy
	Metrics *Metrics
	// Infra counts infrastructure failures (nil: uncounted).
	Infra  *delivery.Metrics
	Logger *slog.Logger
	// Clock is the clock of the gap timeout and what every pause (polls,
	// retries, heartbeats) waits on (nil: clock.System).
	Clock clock.Clock
}

// Consumer runs the event-store subscriptions this host holds the lease
// of: one worker per (group, unit).
type Consumer struct {
	opts Options
	log  *slog.Logger

	wakeMu sync.Mutex
	wake   chan struct{}

	mu      sync.Mutex
	workers map[unitKey]*worker
	// life starts the supervisor and stops it in two phases. Its contexts:
	// stop ends the supervisor and the workers' waits (soft); work is the
	// context of every read, call and commit, canceled at Stop's hard
	// phase. Both are set when the supervisor starts and read only by it
	// and the workers it starts.
	life       lifecycle.Runner
	stop, work context.Context
	wg         sync.WaitGroup
	// outage reports infrastructure failures once per outage.
	outage *delivery.Outage
	// core is the delivery algorithm the workers hand their runs to.
	core *delivery.Core
}

// NewConsumer checks opts and returns a Consumer; Start runs it.
func NewConsumer(opts Options) (*Consumer, error) {
	if opts.Events == nil || opts.Positions == nil || opts.Leases == nil || opts.Failures == nil ||
		opts.Handler == nil || opts.Skip == nil || opts.Subscriptions == nil || opts.Owner == "" {
		return nil, fmt.Errorf("subscription: Events, Positions, Leases, Failures, Handler, Skip, Subscriptions and Owner are required: %w", ErrInvalid)
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = opts.LeaseTTL / 5
	}
	if opts.Poll <= 0 {
		opts.Poll = DefaultPoll
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultBatchSize
	}
	if opts.GapTimeout <= 0 {
		opts.GapTimeout = DefaultGapTimeout
	}
	if opts.Retry.MaxRetries < 0 {
		opts.Retry.MaxRetries = 0
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Classify == nil {
		opts.Classify = classifyDefault
	}
	if opts.Key == nil {
		opts.Key = func(string, json.RawMessage) string { return "" }
	}
	outage := opts.Infra.Outage("event-store subscription", opts.Logger, opts.Clock.Now)
	return &Consumer{opts: opts, log: opts.Logger, wake: make(chan struct{}), workers: map[unitKey]*worker{},
		outage: outage,
		core: &delivery.Core{Policy: opts.Retry, Classify: opts.Classify, Outage: outage, Clock: opts.Clock,
			What: "subscription", Log: opts.Logger},
		life: lifecycle.Runner{Name: "event-store subscription consumer", Log: opts.Logger}}, nil
}

// Notify wakes the caught-up workers: a commit in this process may have
// appended events (wire it to the unit of work's Committed). Other hosts'
// appends are seen within Poll.
func (c *Consumer) Notify() {
	c.wakeMu.Lock()
	close(c.wake)
	c.wake = make(chan struct{})
	c.wakeMu.Unlock()
}

func (c *Consumer) woken() <-chan struct{} {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	return c.wake
}

// Start runs the supervisor: every Heartbeat it renews the leases of the
// running workers, stops those whose subscription is gone or whose lease
// was lost, and starts a worker for each subscription whose lease it
// acquires. ctx's values are kept, its cancellation is not.
func (c *Consumer) Start(ctx context.Context) error {
	return c.life.Start(ctx, func(soft, work context.Context) {
		c.stop, c.work = soft, work
		c.supervise()
		c.wg.Wait()
	})
}

// Stop stops the consumer in two phases. Soft: no worker takes a new
// batch; the batches in hand commit; the leases are released (another
// host takes over at once). Hard, at ctx's end: reads, guest calls and
// commits are canceled (nothing half-committed: a canceled commit rolls
// back and the messages are read again by the next owner), and Stop
// returns ctx's error within lifecycle.Grace (lifecycle.ErrAbandoned if
// work still runs then). Stop before Start and a second Stop are no-ops.
func (c *Consumer) Stop(ctx context.Context) error { return c.life.Stop(ctx) }

func (c *Consumer) supervise() {
	for {
		c.pass()
		select {
		case <-c.stop.Done():
			c.mu.Lock()
			ws := c.workers
			c.mu.Unlock()
			for _, w := range ws {
				<-w.done
			}
			return
		case <-c.opts.Clock.After(c.opts.Heartbeat):
		}
	}
}

// pass is one supervisor round.
func (c *Consumer) pass() {
	ctx := c.work
	want := map[unitKey]Subscription{}
	for _, s := range c.opts.Subscriptions() {
		want[unitKey{s.Group, s.Unit()}] = s
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, w := range c.workers {
		select {
		case <-w.done:
			delete(c.workers, k)
			continue
		default:
		}
		if s, ok := want[k]; !ok || s != w.sub {
			w.cancel() // gone, or changed: a new worker starts on a later pass
			continue
		}
		ok, err := c.opts.Leases.Renew(ctx, k.group, k.unit, c.opts.Owner, c.opts.LeaseTTL)
		if err != nil {
			c.log.Warn("subscription: renew lease", "group", k.group, "unit", k.unit, "error", err)
			continue // the fence still guards the effects; try again next pass
		}
		if !ok {
			c.log.Warn("subscription: lease lost", "group", k.group, "unit", k.unit)
			w.lose()
			w.cancel()
		}
	}
	for k, s := range want {
		if _, running := c.workers[k]; running {
			continue
		}
		ok, err := c.opts.Leases.Acquire(ctx, k.group, k.unit, c.opts.Owner, c.opts.LeaseTTL)
		if err != nil {
			c.log.Warn("subscription: acquire lease", "group", k.group, "unit", k.unit, "error", err)
			continue
		}
		if !ok {
			continue
		}
		c.opts.Metrics.lease(k.group, "acquired")
		w := &worker{c: c, sub: s, done: make(chan struct{}), halted: map[string]bool{}}
		var soft context.Context
		soft, w.cancel = context.WithCancel(c.stop)
		c.workers[k] = w
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer close(w.done)
			defer w.cancel()
			w.run(soft)
			w.release()
		}()
	}
	c.opts.Metrics.owned.Set(float64(len(c.workers)))
}
