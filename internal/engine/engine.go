package engine

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/record"
)

// Options configure an Engine.
type Options struct {
	Events  eventstore.Store
	Records record.Store
	// UnitOfWork commits handlers' effects. Its Keys should be the Engine
	// (see Engine.PartitionField), so a reload's keys apply at once.
	UnitOfWork *unitofwork.UnitOfWork
	Logger     *slog.Logger
	Metrics    *Metrics
	// Clock is what the engine reads and what its consumers' pauses wait
	// on (nil: clock.System).
	Clock clock.Clock
	// MaxCascadeDepth bounds causation chains: a message at depth d (see
	// abi.Metadata.CascadeDepth) may append events or dispatch commands
	// only while d+1 <= MaxCascadeDepth (default MaxFollowUpDepth).
	MaxCascadeDepth int
	// MaxFollowUps bounds the events and commands one message may ask for
	// (default DefaultMaxFollowUps).
	MaxFollowUps int
	// Partitioned says partitioned categories are delivered by partition
	// workers (package internal/redispartition), not the broker groups:
	// read-your-writes asks Progress about them.
	Partitioned bool
	// EventStore says every event handler, projector and process manager
	// is served by event-store subscriptions (package subscription, through
	// [Engine.Handler]), and no broker group runs: one delivery path per handler.
	EventStore bool
	// Handled, if set, sees every message a handler handled or failed
	// (see [Handled]); `protean-host plugin test` prints them.
	Handled func(Handled)
	// Progress answers read-your-writes (WaitHandled) for what the
	// partition workers or the event-store subscriptions deliver, of every
	// host instance (partition.Progress, subscription.Progress; nil: nothing
	// is known of other processes).
	Progress readyourwrites.Source
	// BrokerProgress answers it for what the broker groups deliver
	// (groups.Progress; nil: nothing counts as handled but what this
	// engine marks).
	BrokerProgress readyourwrites.Source
	// DocumentCacheBytes bounds the cache of the documents projectors
	// declaring documents_by_key committed, which serves their units'
	// next loads (see documents); 0 keeps no cache ([plugins]
	// document_cache_mb defaults to DefaultDocumentCacheBytes).
	DocumentCacheBytes int
}

// Engine runs handler modules: it dispatches commands to command handlers
// and commits their effects, serves handlers' host-function calls, and
// handles the runs of events its delivery sources hand it ([Engine.Handler])
// for event handlers, projectors and process managers.
type Engine struct {
	opts   Options
	tracer trace.Tracer // telemetry.Tracer (tracing.go)
	loaded atomic.Pointer[loaded]
	log    *slog.Logger
	now    func() time.Time

	// commands admits dispatches until Stop, which drains them.
	commands *gate
	// rw is the read-your-writes wait (WaitHandled) over what this
	// process's sources have handed it.
	rw *readyourwrites.Waiter
	// work is the engine's own context: every guest call and commit runs
	// under a context that ends when it does, whatever the caller's
	// context. Stop's hard phase cancels it.
	work       context.Context
	cancelWork context.CancelFunc

	mu sync.Mutex
	// stopping is set (under mu) when Stop begins: Swap then refuses new
	// sets, so no retirement starts after Stop has counted them.
	stopping bool
	// retiring counts the goroutines closing retired sets; Stop waits for
	// them.
	retiring sync.WaitGroup
	// stopped is closed when Stop begins; done when everything the engine
	// started has ended and every set it owned is closed.
	stopped  chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// loaded is one module set and what is derived from it, swapped whole.
// users admits the calls that use its modules; a retired set is closed
// once its last call has left.
type loaded struct {
	set    *host.Set
	scopes map[*host.Module]*scope
	users  *gate
	// docs caches the documents of the set's projectors named in cached
	// (nil: no cache); a set swapped in starts empty.
	docs   *documents
	cached map[string]bool
}

// acquire returns the running set, admitted for a call; release it with
// l.users.leave(). A set retired in between is skipped for its successor;
// once Stop has retired the last set there is none, and acquire answers
// ErrStopped (work left running past Stop's deadline ends here).
func (e *Engine) acquire() (*loaded, error) {
	for {
		l := e.loaded.Load()
		if l.users.enter() {
			return l, nil
		}
		if e.loaded.Load() == l {
			return nil, ErrStopped
		}
	}
}

// owned returns ctx, keeping its values and cancellation, also canceled
// when Stop's hard phase cancels the engine's work.
func (e *Engine) owned(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(e.work, cancel)
	return ctx, func() { unhook(); cancel() }
}

// New returns an Engine running set.
func New(set *host.Set, opts Options) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(nil)
	}
	if opts.MaxCascadeDepth <= 0 {
		opts.MaxCascadeDepth = MaxFollowUpDepth
	}
	if opts.MaxFollowUps <= 0 {
		opts.MaxFollowUps = DefaultMaxFollowUps
	}
	if opts.BrokerProgress == nil {
		opts.BrokerProgress = &unmarked{}
	}
	e := &Engine{opts: opts, tracer: telemetry.Tracer(), log: opts.Logger, now: opts.Clock.Now, commands: newGate(),
		stopped: make(chan struct{}), done: make(chan struct{})}
	e.rw = readyourwrites.New(readyourwrites.Options{Events: opts.Events, KeyOf: partition.FieldKey, After: opts.Clock.After, Logger: opts.Logger})
	e.work, e.cancelWork = context.WithCancel(context.Background())
	e.Swap(set)
	return e
}

// Swap makes set the running module set; the engine owns it from here and
// closes it when it is retired or the engine stops. Calls in flight finish
// on the set they started with, which is closed once they have all left.
// The delivery sources follow the new set by their own means (the broker
// groups' Resubscribe; the partition workers and the event-store
// subscriptions read their subscriptions each pass). Once Stop has begun,
// Swap closes set at once and changes nothing.
func (e *Engine) Swap(set *host.Set) {
	l := &loaded{set: set, scopes: map[*host.Module]*scope{}, users: newGate(),
		docs: newDocuments(e.opts.DocumentCacheBytes), cached: cachedProjectors(set)}
	for _, m := range set.Modules() {
		l.scopes[m] = newScope(set, m, e.scopeRefused)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		if err := set.Close(context.Background()); err != nil {
			e.log.Warn("closing a module set swapped in after stop", "error", err)
		}
		return
	}
	old := e.loaded.Swap(l)
	if old != nil {
		e.retire(old)
	}
}

// retire closes a set once the calls using it have left, on a goroutine
// Stop waits for (e.retiring). Callers hold e.mu with e.stopping false, or
// are Stop retiring the last set.
func (e *Engine) retire(l *loaded) {
	idle := l.users.close()
	e.retiring.Add(1)
	go func() {
		defer e.retiring.Done()
		<-idle
		if err := l.set.Close(context.Background()); err != nil {
			e.log.Warn("closing a retired module set", "error", err)
		}
	}()
}

// Set returns the running module set.
func (e *Engine) Set() *host.Set { return e.loaded.Load().set }

// CommandResult is what a committed command produced.
type CommandResult struct {
	// ID is the command's message id (the events' causation id).
	ID     string          `json:"id"`
	Events []AppendedEvent `json:"events"`
	// Dispatched are the follow-up commands the handler asked for and
	// their outcome.
	Dispatched []DispatchedCommand `json:"dispatched,omitempty"`
}

// AppendedEvent identifies an event a command appended.
type AppendedEvent struct {
	ID             string `json:"id"`
	Type           string `json:"type"`
	Stream         string `json:"stream"`
	Position       int64  `json:"position"`
	GlobalPosition int64  `json:"global_position"`
}

// Appended identifies the events a command appended.
func Appended(evs []eventstore.Event) []AppendedEvent {
	out := make([]AppendedEvent, len(evs))
	for i, ev := range evs {
		out[i] = AppendedEvent{ID: ev.ID, Type: ev.Type, Stream: ev.Stream, Position: ev.Position, GlobalPosition: ev.GlobalPosition}
	}
	return out
}

// DispatchedCommand is a follow-up command and its outcome.
type DispatchedCommand struct {
	Type  string `json:"type"`
	Error string `json:"error,omitempty"`
}

// Dispatch runs a command through its handler and commits the effects in
// one unit of work. The call and the commit run under ctx and the
// engine's own context, so Stop's hard phase cancels them too. Errors:
// ErrUnknownCommand, ErrBadInput, an *abi.InputError (the payload does not
// match the declared fields), ErrStopped, a *HandlerError (Rejected()
// for 422), a *ScopeError, a conflict (unitofwork.Conflict), a
// *unitofwork.KeyError.
func (e *Engine) Dispatch(ctx context.Context, typ string, data json.RawMessage, md abi.Metadata) (*CommandResult, error) {
	if !e.commands.enter() {
		return nil, ErrStopped
	}
	defer e.commands.leave()
	ctx, cancel := e.owned(ctx)
	defer cancel()
	md.CascadeDepth = 0 // a command from outside begins a chain
	return e.dispatch(ctx, typ, data, md)
}

// MaxFollowUpDepth is the default of Options.MaxCascadeDepth.
const MaxFollowUpDepth = 16

// DefaultMaxFollowUps is the default of Options.MaxFollowUps.
const DefaultMaxFollowUps = 256

// Errors of follow-up work over its budget (see cascade.go).
var (
	// ErrFollowUpDepth: a message's follow-ups would be deeper in their
	// causation chain than Options.MaxCascadeDepth.
	ErrFollowUpDepth = errors.New("follow-up work nested deeper than the cascade budget")
	// ErrFollowUps: one message asked for more events and commands than
	// Options.MaxFollowUps.
	ErrFollowUps = errors.New("too many follow-ups for one message")
)

// MaxMetadataBytes caps the metadata a command carries (its JSON form):
// the metadata travels with every event the command causes, so a client
// cannot make every one of them large. Over HTTP a correlation id is at
// most 255 bytes already; this bounds every other way in (plugin test
// files, follow-up commands of a module with long names).
const MaxMetadataBytes = 2048

// metadataSize is the length of md's JSON form.
func metadataSize(md abi.Metadata) int {
	b, err := json.Marshal(md)
	if err != nil {
		return 0 // strings and ints only: cannot fail
	}
	return len(b)
}

// dispatch is Dispatch without the gate: follow-up commands of work already
// admitted run even while the engine drains.
func (e *Engine) dispatch(ctx context.Context, typ string, data json.RawMessage, md abi.Metadata) (_ *CommandResult, err error) {
	// The command's creation context: the caller's span (an HTTP
	// request's, a process manager's dispatch), if there is one; else the
	// trace its metadata carries (a follow-up of a delivered message
	// stays in the trace of what caused it).
	if sc := telemetry.SpanContext(&md); sc.IsValid() && !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	telemetry.Inject(ctx, &md)
	id := eventstore.NewID()
	ctx, span := e.startDispatch(ctx, typ, id, &md)
	defer func() { telemetry.End(span, err) }()
	l, err := e.acquire()
	if err != nil {
		return nil, err
	}
	defer l.users.leave()
	route, ok := l.set.Command(typ)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownCommand, typ)
	}
	if !isObject(data) {
		return nil, fmt.Errorf("%w: command %s: body must be a JSON object", ErrBadInput, typ)
	}
	if n := metadataSize(md); n > MaxMetadataBytes {
		return nil, fmt.Errorf("%w: command %s: metadata of %d bytes exceeds the %d-byte limit", ErrBadInput, typ, n, MaxMetadataBytes)
	}
	if err := checkCommand(route, typ, data); err != nil {
		return nil, err
	}
	env := abi.Envelope{ID: id, Type: typ, Time: e.now().UTC(), Data: data, Metadata: &md}
	if md.CorrelationID == "" {
		env.Metadata.CorrelationID = env.ID
	}
	res, err := e.handleOne(ctx, l, route, env)
	if err != nil {
		return nil, inputCause(typ, data, err)
	}
	events := causedBy(env, route.Module)
	telemetry.Inject(ctx, &events) // the dispatch span created them
	cctx, commit := e.tracer.Start(ctx, "commit")
	committed, err := e.opts.UnitOfWork.Commit(cctx, unitofwork.Change{Effects: res.Effects, Metadata: events})
	telemetry.End(commit, err)
	e.opts.Metrics.commit(route, err)
	if err != nil {
		return nil, err
	}
	e.rw.Appended(committed.Events) // a read of one's own write finds its key here
	out := &CommandResult{ID: env.ID, Events: Appended(committed.Events)}
	out.Dispatched = e.followUp(ctx, committed.Commands, env)
	return out, nil
}

// followUp dispatches the commands a committed unit of work asked for. Their
// failures are logged and reported, not returned: the cause has committed.
func (e *Engine) followUp(ctx context.Context, cmds []abi.NewCommand, cause abi.Envelope) []DispatchedCommand {
	var out []DispatchedCommand
	for _, c := range cmds {
		d := DispatchedCommand{Type: c.Type}
		_, err := e.dispatch(ctx, c.Type, c.Data, caused(cause))
		if err != nil {
			d.Error = err.Error()
			e.log.Warn("follow-up command failed", "type", c.Type, "causation_id", cause.ID, "error", err)
		}
		out = append(out, d)
	}
	return out
}

// callFailure classifies a call that failed as a whole (a *host.CallError):
// the message's own failure (permanent: a trap, a timeout, bad output), or
// the host's, marked infrastructure and transient: a stop, every instance
// busy, a call out of time mostly waiting (on the stores, storeWait, or for
// an instance, CallError.Waited) against its deadline timeout, or one that
// failed after a host function's store call failed (storeFailed).
func callFailure(err error, storeWait time.Duration, storeFailed error, timeout time.Duration) (abi.ErrorKind, error) {
	var ce *host.CallError
	switch {
	case errors.As(err, &ce) && (errors.Is(err, host.ErrCanceled) || errors.Is(err, host.ErrNoInstance) || errors.Is(err, host.ErrNotReady)):
		// Not the message's doing: a stop, every instance busy, or the
		// module's code still compiling.
		return abi.ErrorTransient, delivery.MarkInfrastructure(err)
	case errors.Is(err, host.ErrTimeout) && ce != nil && storeWait+ce.Waited >= timeout/2:
		// Out of time mostly waiting on the stores or for an instance
		// (every instance held by calls stalled on the stores, or one slow
		// to create on a loaded machine): the host's time, not a runaway
		// guest's.
		return abi.ErrorTransient, delivery.MarkInfrastructure(fmt.Errorf("%w (%s of it waiting on the stores, %s for an instance)",
			err, storeWait.Round(time.Millisecond), ce.Waited.Round(time.Millisecond)))
	case storeFailed != nil:
		// The call failed (ran out of time, say) after a host function's
		// store call failed on the database: a database that stalls holds
		// the guest in the host function until its deadline. The
		// database's failure, not the message's.
		return abi.ErrorTransient, delivery.MarkInfrastructure(fmt.Errorf("%w (after a store call failed: %v)", err, storeFailed))
	}
	return abi.ErrorPermanent, err
}

// scopeRefused tells the operator, never the guest or client, whose data
// a refused request reached for: a WARN line and a metric naming the other
// tenant.
func (e *Engine) scopeRefused(err *ScopeError) {
	e.opts.Metrics.refusals.WithLabelValues(err.File, err.Tenant, err.Owner).Inc()
	e.log.Warn("refused: outside the module's scope", "module", err.File, "tenant", err.Tenant, "owner", err.Owner, "refused", err.What)
}

// handleOne runs one message through a route and returns its result, or
// the handler's error.
func (e *Engine) handleOne(ctx context.Context, l *loaded, route host.Route, env abi.Envelope) (abi.Result, error) {
	results, err := e.call(ctx, l, route, []abi.Envelope{env}, documentView{})
	if err != nil {
		return abi.Result{}, err
	}
	return results[0].Result, results[0].err
}

// call runs a batch through a route, checks every result's effects against
// the module's scope, and records metrics. Each result carries the error
// the engine reads from it (see [result]).
func (e *Engine) call(ctx context.Context, l *loaded, route host.Route, envs []abi.Envelope, docs documentView) ([]result, error) {
	sc := l.scopes[route.Module]
	start := e.now()
	sess := &session{e: e, scope: sc, stall: route.Module.Limits.Timeout / stallShare, docs: docs}
	ctx, span := e.startHandle(ctx, route, envs)
	defer span.End()
	end := e.opts.Metrics.begin(route)
	results, err := route.Module.Handle(ctx, route.Handler.Name, envs, sess)
	end()
	e.opts.Metrics.call(route, e.now().Sub(start), len(envs), err)
	if err != nil {
		telemetry.End(span, err) // (End twice is a no-op)
		kind, err := callFailure(err, sess.storeWait, sess.storeFailed, route.Module.Limits.Timeout)
		herr := &HandlerError{File: route.Module.File, Handler: route.Handler.Name, Type: envs[0].Type, Kind: kind, Err: err}
		e.handled(route, envs[:1], []result{{err: herr}})
		return nil, herr
	}
	out := e.withinBudget(route, envs, checkResults(route, envs, results, sc, sess.refused))
	// A failure the guest reported after a host function failed on the
	// store is the store's: the guest only passed it on. Its cause is
	// the store's error, marked infrastructure, so it is retried without
	// end and never charged to the message.
	if cause := cmp.Or(delivery.MarkInfrastructure(sess.storeFailed), sess.tooLong); cause != nil {
		for i := range out {
			var ge *guestError
			if errors.As(out[i].err, &ge) && ge.cause == nil {
				ge.cause = cause
			}
		}
	}
	e.handled(route, envs, out)
	failedResults(span, out)
	return out, nil
}

// Projection returns a projection document and its version.
func (e *Engine) Projection(ctx context.Context, name, id string) (json.RawMessage, int64, error) {
	if !e.loaded.Load().set.Projection(name) {
		return nil, 0, fmt.Errorf("%w: %s", ErrUnknownProjection, name)
	}
	if id == "" || len(id) > abi.MaxIDLength {
		return nil, 0, fmt.Errorf("%w: projection %s has no document %q", ErrNotFound, name, id)
	}
	r, err := e.opts.Records.Load(ctx, record.Key{Kind: string(abi.RecordProjection), Type: name, ID: id})
	if err != nil {
		return nil, 0, err
	}
	if !r.Exists() {
		return nil, 0, fmt.Errorf("%w: projection %s has no document %q", ErrNotFound, name, id)
	}
	return r.Data, r.Version, nil
}

func isObject(b json.RawMessage) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// Healthy returns nil while the engine accepts work.
func (e *Engine) Healthy() error {
	select {
	case <-e.stopped:
		return ErrStopped
	default:
		return nil
	}
}

// moduleRef names the module build whose handler produced an event.
func moduleRef(m *host.Module) *abi.ModuleRef {
	return &abi.ModuleRef{Name: m.Manifest.Module.Name, Version: m.Manifest.Module.Version, SHA256: m.SHA256}
}
