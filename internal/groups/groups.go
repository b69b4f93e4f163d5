package groups

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/lifecycle"
)

// Source is where the groups read: a broker's consumer side that can
// block for the next message.
type Source interface {
	broker.Consumer
	broker.Waiter
}

// DefaultBatch is the most messages a group hands its handler in one run
// when Options.Batch is 0.
const DefaultBatch = 64

// Options configure a Consumer.
type Options struct {
	Source Source
	// Handler commits a run's effects (engine.Handler): a batch from a
	// group has no Unit and no fence.
	Handler delivery.Handler
	// Classify says whose failure a handler's error is (engine.Classify).
	Classify func(error) delivery.Class
	// Groups lists the running set's groups (routes.Table.Groups); Start
	// and Resubscribe read it.
	Groups func() []Group
	// Handles reports whether handler handles message type typ in the
	// running set; a message it does not is counted as skipped, not
	// acked (nil: every message counts as acked).
	Handles func(handler, typ string) bool
	// Batch is the most messages a group hands its handler in one run,
	// taking only what is already ready (default DefaultBatch; 1 delivers
	// one message per call). Runs need a broker.Batcher source; others
	// deliver one by one.
	Batch int
	// Retry is the policy the broker applies (the config's): a message
	// failing on its own is nacked and redelivered by the broker while it
	// has retries left, and a permanent failure is rejected at once
	// (broker.Rejecter). Its jitter also spreads the infrastructure
	// retries.
	Retry delivery.Policy
	// Infra counts the groups' infrastructure failures (nil: uncounted).
	Infra   *delivery.Metrics
	Metrics *Metrics // nil: uncounted
	// Progress is told when the groups start (see Progress); nil: no
	// read-your-writes source is kept.
	Progress *Progress
	Logger   *slog.Logger
	Clock    clock.Clock // nil: clock.System
}

// Consumer runs one consumer per group: a handler reading one category's
// broker stream as its own consumer group, one run at a time, in order.
// Resubscribe makes the groups follow a reloaded set.
type Consumer struct {
	opts    Options
	log     *slog.Logger
	core    *delivery.Core
	runner  lifecycle.Runner
	changed chan struct{}
}

// New returns a Consumer; Start starts it.
func New(o Options) *Consumer {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Clock = clock.Or(o.Clock)
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	outage := o.Infra.Outage("delivery", o.Logger, o.Clock.Now)
	return &Consumer{opts: o, log: o.Logger, changed: make(chan struct{}, 1),
		runner: lifecycle.Runner{Name: "broker groups", Log: o.Logger},
		// The broker owns the retry of a message's own failure: its nack
		// schedules the redelivery by the same policy (brokerRun).
		core: &delivery.Core{Policy: o.Retry, Classify: o.Classify, Outage: outage, Clock: o.Clock, What: "delivery", Log: o.Logger}}
}

// Start begins delivering the running set's groups. ctx's values are kept,
// its cancellation is not: the groups run until Stop. A second Start, or a
// Start after Stop, is an error.
func (c *Consumer) Start(ctx context.Context) error {
	now := c.opts.Clock.Now()
	if err := c.runner.Start(ctx, c.run); err != nil {
		return err
	}
	c.opts.Progress.start(now)
	return nil
}

// Resubscribe makes the running groups match the running set (after a
// reload): groups the set no longer has stop after their run in hand,
// new ones start. Before Start and after Stop it does nothing.
func (c *Consumer) Resubscribe() {
	select {
	case c.changed <- struct{}{}:
	default: // one is pending: it will read the newest set
	}
}

// Stop stops the groups in two phases (lifecycle.Runner). Soft: no group
// takes a new message, and the runs in hand go to their end and settle.
// Hard, if ctx ends first: the runs are canceled (a canceled message is
// released or nacked, and redelivered later) and Stop waits at most
// lifecycle.Grace for them, returning ctx's error, wrapped with
// lifecycle.ErrAbandoned if a guest call that cannot be canceled is left
// running.
func (c *Consumer) Stop(ctx context.Context) error { return c.runner.Stop(ctx) }

// Group is one consumer group: a handler reading one category's broker
// stream as its own group.
type Group struct {
	Handler, Stream string
}

// running is one group's consumer: its wait's cancel, and done.
type running struct {
	stop context.CancelFunc
	done chan struct{}
}

// run is the supervisor: it owns the running groups, restarts them to
// follow Resubscribe, and on soft's end stops them and waits for them.
func (c *Consumer) run(soft, work context.Context) {
	var wg sync.WaitGroup
	live := map[Group]*running{}
	// A group restarted by a reload waits for its stopping predecessor,
	// so one group never has two consumers.
	stopping := map[Group]*running{}
	for {
		c.resubscribe(soft, work, &wg, live, stopping)
		select {
		case <-c.changed:
		case <-soft.Done():
			for _, r := range live {
				r.stop()
			}
			wg.Wait()
			return
		}
	}
}

func (c *Consumer) resubscribe(soft, work context.Context, wg *sync.WaitGroup, live, stopping map[Group]*running) {
	for g, r := range stopping {
		select {
		case <-r.done:
			delete(stopping, g)
		default:
		}
	}
	want := map[Group]bool{}
	gs := c.opts.Groups()
	for _, g := range gs {
		want[g] = true
	}
	stopped := 0
	for g, r := range live {
		if !want[g] {
			r.stop()
			stopping[g] = r
			delete(live, g)
			stopped++
		}
	}
	started := 0
	for _, g := range gs {
		if _, ok := live[g]; ok {
			continue
		}
		waitCtx, stop := context.WithCancel(soft)
		r := &running{stop: stop, done: make(chan struct{})}
		prev := stopping[g]
		delete(stopping, g)
		live[g] = r
		wg.Add(1)
		started++
		go func() {
			defer wg.Done()
			defer close(r.done)
			defer stop()
			if prev != nil {
				<-prev.done
			}
			c.consume(waitCtx, work, g)
		}()
	}
	// The line counts what this consumer runs, broker consumer groups, and
	// says so: the partitioned handlers run as partition workers, which
	// log their own count ("partitions running"), and a host whose
	// handlers are all partitioned logged "delivery consumers running=0"
	// beside its running workers. A pass that changes nothing says nothing.
	if started > 0 || stopped > 0 {
		c.log.Info("broker consumer groups running", "groups", len(live), "started", started, "stopped", stopped)
	}
}

// The pause after a failed Wait: first, and at most.
const (
	waitRetryMin = 50 * time.Millisecond
	waitRetryMax = 5 * time.Second
)

// consume is one group's loop. A failing Wait is retried after a pause
// that doubles up to waitRetryMax, so a broker that is down is not
// hammered.
func (c *Consumer) consume(waitCtx, workCtx context.Context, g Group) {
	pause := waitRetryMin
	for {
		d, err := c.opts.Source.Wait(waitCtx, g.Stream, g.Handler)
		if err != nil {
			if waitCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return
			}
			c.log.Error("delivery: wait failed", "handler", g.Handler, "stream", g.Stream, "error", err, "retry_in", pause)
			select {
			case <-waitCtx.Done():
				return
			case <-c.opts.Clock.After(pause):
			}
			pause = min(2*pause, waitRetryMax)
			continue
		}
		pause = waitRetryMin
		c.deliver(waitCtx, workCtx, g, c.extend(waitCtx, g, d))
	}
}
