package engine

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/internal/lifecycle"
)

// Source is where the engine's consumers read: a consumer side of a broker
// that can block for the next message.
type Source interface {
	broker.Consumer
	broker.Waiter
}

// subscription is one consumer: a handler reading one broker stream (its
// category) as its own consumer group.
type subscription struct {
	handler string
	stream  string
}

// subscriptions lists every (handler, category) pair of the set, in a
// stable order; with partitioned, not the partitioned categories.
func subscriptions(set *host.Set, partitioned bool) []subscription {
	seen := map[subscription]bool{}
	var out []subscription
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			if h.Kind == abi.KindCommandHandler {
				continue
			}
			for _, t := range h.Handles {
				msg, _ := set.Message(t)
				if _, ok := set.PartitionField(msg.Category); ok && partitioned {
					continue // the partition workers deliver it
				}
				s := subscription{handler: h.Name, stream: msg.Category}
				if !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].handler != out[j].handler {
			return out[i].handler < out[j].handler
		}
		return out[i].stream < out[j].stream
	})
	return out
}

// consumers is the running delivery side: one goroutine per subscription.
type consumers struct {
	source Source
	base   context.Context // Start's context, without its cancellation
	work   context.Context // canceled at Stop's hard phase (see Engine.owned)
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// running and stopping hold each consumer's wait cancel and done;
	// a subscription restarted by a reload waits for its stopping
	// predecessor, so one group never has two consumers.
	running  map[subscription]*consumer
	stopping map[subscription]*consumer
}

type consumer struct {
	stop context.CancelFunc
	done chan struct{}
}

// Start begins delivering events from source to the set's event handlers,
// projectors and process managers: one consumer per handler and category,
// each handling its messages one at a time, in order. ctx's values are
// kept, its cancellation is not: the consumers run until Stop. A second
// Start, or a Start after Stop, is an error.
func (e *Engine) Start(ctx context.Context, source Source) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		return ErrStopped
	}
	if e.running != nil {
		return errors.New("engine: already started")
	}
	e.startedAt.Store(e.now().UnixNano())
	base := context.WithoutCancel(ctx)
	work, cancel := e.owned(base)
	e.running = &consumers{source: source, base: base, work: work, cancel: cancel,
		running: map[subscription]*consumer{}, stopping: map[subscription]*consumer{}}
	e.resubscribeLocked()
	return nil
}

// resubscribeLocked makes the running consumers match the running set.
// The caller holds e.mu.
func (e *Engine) resubscribeLocked() {
	c := e.running
	if c == nil {
		return
	}
	subs := subscriptions(e.Set(), e.opts.Partitioned)
	if e.opts.EventStore {
		subs = nil // the event-store subscriptions deliver everything
	}
	want := map[subscription]bool{}
	for _, s := range subs {
		want[s] = true
	}
	for s, cons := range c.running {
		if !want[s] {
			cons.stop()
			c.stopping[s] = cons
			delete(c.running, s)
		}
	}
	started := 0
	for _, s := range subs {
		if _, ok := c.running[s]; ok {
			continue
		}
		waitCtx, stop := context.WithCancel(c.base)
		cons := &consumer{stop: stop, done: make(chan struct{})}
		prev := c.stopping[s]
		delete(c.stopping, s)
		c.running[s] = cons
		c.wg.Add(1)
		started++
		go func() {
			defer c.wg.Done()
			defer close(cons.done)
			defer stop()
			if prev != nil {
				<-prev.done
			}
			e.consume(waitCtx, c.work, c.source, s)
		}()
	}
	e.log.Info("delivery consumers", "running", len(c.running), "started", started)
}

// StopGrace is how long Stop waits, once its deadline has canceled the
// work in progress, for that work to return before it gives up on it.
const StopGrace = lifecycle.Grace

// ErrAbandoned: Stop's deadline passed and, StopGrace after canceling it,
// work was still running (a guest call of an uninterruptible module
// cannot be canceled). Stop returned without it; see Stop.
var ErrAbandoned = lifecycle.ErrAbandoned

// Stop stops the engine in two phases.
//
// Soft: new commands are refused (ErrStopped) and no consumer takes a new
// message; commands in flight and the messages consumers hold run to
// their end and commit. Then the running set and every retired set still
// closing are closed, and Stop returns nil.
//
// Hard, if ctx ends first: the engine's own context, under which every
// guest call and commit runs (whatever the caller's context), is
// canceled, so interruptible calls and commits return at once and commit
// nothing (a canceled message is nacked and redelivered later; a canceled
// command answers an error). Stop then waits at most StopGrace for them
// and returns ctx's error. A call that cannot be canceled (a module with
// interruptible = false, spinning in guest code) is not waited for: Stop
// returns ErrAbandoned (wrapping ctx's error) and the call goes on in the
// background; when it returns, its result is discarded (its commit fails
// on the canceled context), and its set is closed after it. Done reports
// when that has happened; a process that exits instead simply ends it.
//
// Stop before Start drains commands and closes the set. A second Stop is a
// no-op that returns nil.
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
	c := e.running
	e.running = nil
	if c != nil {
		for _, cons := range c.running {
			cons.stop()
		}
	}
	e.mu.Unlock()
	// The finisher owns the end of the engine: it waits for the consumers
	// and the commands, retires the last set, waits for every set to
	// close, and closes done. Stop waits for it, unless it abandons.
	go func() {
		if c != nil {
			c.wg.Wait()
			c.cancel()
		}
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

// consume is one consumer's loop. A failing Wait is retried after a pause
// that doubles up to waitRetryMax, so a broker that is down is not
// hammered.
func (e *Engine) consume(waitCtx, workCtx context.Context, src Source, s subscription) {
	pause := waitRetryMin
	for {
		d, err := src.Wait(waitCtx, s.stream, s.handler)
		if err != nil {
			if waitCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return
			}
			e.log.Error("delivery: wait failed", "handler", s.handler, "stream", s.stream, "error", err, "retry_in", pause)
			select {
			case <-waitCtx.Done():
				return
			case <-e.after(pause):
			}
			pause = min(2*pause, waitRetryMax)
			continue
		}
		pause = waitRetryMin
		e.deliverRun(waitCtx, workCtx, src, s, e.extend(waitCtx, src, s, d))
	}
}

// The pause after a failed Wait: first, and at most.
const (
	waitRetryMin = 50 * time.Millisecond
	waitRetryMax = 5 * time.Second
)

// settle acks d (cause nil) or nacks it, whatever ctx, and counts the
// outcome; a failure is logged (the broker redelivers the message: at
// least once is what a consumer group promises).
func (e *Engine) settle(ctx context.Context, src Source, s subscription, d broker.Delivery, outcome string, cause error) {
	var err error
	// Settle even if ctx was canceled mid-message: the broker's state must
	// follow what happened.
	sctx := context.WithoutCancel(ctx)
	if cause == nil {
		err = src.Ack(sctx, s.stream, s.handler, d.ID)
	} else {
		err = src.Nack(sctx, s.stream, s.handler, d.ID)
	}
	if err != nil {
		e.log.Error("delivery: settle failed", "handler", s.handler, "outcome", outcome, "message_id", d.ID, "error", err)
	}
	e.opts.Metrics.delivery(s.handler, outcome)
}

// route finds the handler named handler among typ's subscribers.
func (l *loaded) route(handler, typ string) (host.Route, bool) { return routeIn(l.set, handler, typ) }

// routeIn finds the handler named handler among typ's subscribers in set.
func routeIn(set *host.Set, handler, typ string) (host.Route, bool) {
	for _, r := range set.Subscribers(typ) {
		if r.Handler.Name == handler {
			return r, true
		}
	}
	return host.Route{}, false
}

// messageEnvelope is the ABI envelope of a broker message.
func (e *Engine) messageEnvelope(m delivery.Message) abi.Envelope {
	return abi.Envelope{ID: m.ID, Type: m.Type, Stream: m.EventStream, Position: m.Position,
		GlobalPosition: m.GlobalPosition, Time: m.Time, Data: m.Data, Metadata: e.metadata(m.ID, m.Metadata)}
}

func correlation(env abi.Envelope) string {
	if env.Metadata != nil && env.Metadata.CorrelationID != "" {
		return env.Metadata.CorrelationID
	}
	return env.ID
}
