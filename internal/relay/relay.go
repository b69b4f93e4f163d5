package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/lifecycle"
	"github.com/proteanhq/protean-host/internal/owner"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
)

// Options configure a Relay. Zero fields take the values of
// [DefaultOptions], except Jitter, the retentions and LeaseFor, whose
// zero means none (no jitter, keep forever, no lease).
type Options struct {
	// Broker is the name of the broker the relay serves: it claims only
	// rows whose target_broker is Broker.
	Broker string
	// Owner identifies this relay in locked_by (unique per host instance).
	Owner     string
	Publisher broker.Publisher
	// BatchSize is the rows claimed per pass (messages_per_tick).
	BatchSize int
	// Tick is the pause after a pass that found nothing.
	Tick time.Duration
	// LockFor is how long a claim holds a row.
	LockFor time.Duration
	// LeaseFor is how long the broker's relay lease lasts unless renewed,
	// on a store that keeps one (outbox.RelayLeaser: the memory and
	// PostgreSQL stores): only its holder claims, so that the relays of
	// several hosts do not split one broker's rows between them. The
	// holder renews it every LeaseFor/3; the others try to take it every
	// LeaseFor/5, so a holder that dies or hangs stalls the broker's rows
	// for at most about 1.2 LeaseFor, and one that stops gives it up at
	// once. 0 (the zero Options) holds no lease: every relay claims.
	LeaseFor time.Duration
	// BaseDelay, MaxDelay and Jitter shape the retry backoff.
	BaseDelay, MaxDelay time.Duration
	Jitter              float64
	// BackfillSuffix names the backfill lane; with LanesEnabled, rows of
	// priority below LaneThreshold go to it.
	BackfillSuffix string
	LanesEnabled   bool
	LaneThreshold  int
	// PublishedRetention and AbandonedRetention are how long published and
	// abandoned rows are kept (0 keeps them forever); the relay deletes
	// older ones every CleanupEvery (default one minute).
	PublishedRetention, AbandonedRetention time.Duration
	CleanupEvery                           time.Duration
	// RestartWindow is how far before the broker's last publish the rows
	// go again after the broker restarted keeping its marker
	// (broker.ErrRestarted): what a Redis that fsyncs every second, or a
	// replica promoted behind its primary, may have lost. 0 republishes
	// nothing then (the broker loses no acknowledged write: appendfsync
	// always, no failover) and only marks it anew.
	RestartWindow time.Duration
	// Partitions are the partition consumer groups (nil: none), read when
	// the broker needs a republish: rows every one of them has applied by
	// the table of consumer positions are not sent again.
	Partitions func() []partition.Subscription
	// Infra counts infrastructure failures (nil: uncounted).
	Infra  *delivery.Metrics
	Logger *slog.Logger
	// Clock is what the relay reads (claim locks, backoff, retention) and
	// what its pauses between passes wait on (nil: clock.System).
	Clock clock.Clock
	Rand  func() float64
}

// DefaultOptions returns the relay's defaults, which config.Default
// reads too ([outbox] in the configuration): Protean's values. Broker,
// Owner, Publisher, the lanes, Logger, Now and Rand are left for the caller.
func DefaultOptions() Options {
	return Options{
		BatchSize:          outbox.DefaultClaimLimit,
		Tick:               10 * time.Millisecond,
		LockFor:            outbox.DefaultLockFor,
		LeaseFor:           outbox.DefaultLeaseFor,
		BaseDelay:          time.Second,
		MaxDelay:           time.Minute,
		Jitter:             0.1,
		BackfillSuffix:     partition.DefaultBackfillSuffix,
		PublishedRetention: 7 * 24 * time.Hour,  // a week
		AbandonedRetention: 30 * 24 * time.Hour, // 30 days
		CleanupEvery:       time.Minute,
		RestartWindow:      time.Minute,
	}
}

// Relay moves outbox rows to the broker: claim, publish outside any
// transaction, then mark published, or failed with a backoff, or halted
// or abandoned past its retries; a row the broker could not take (down,
// restarting) is released uncounted, however long the outage lasts.
// A crash between publish and mark leaves the row claimed; its lock expires
// and it is published again (at least once).
type Relay struct {
	store outbox.RelayStore
	opts  Options
	wake  chan struct{}
	// heard receives the wake-ups other hosts' relays send the lease's
	// holder (outbox.RelayWaker).
	heard chan struct{}
	// outage reports passes that fail on infrastructure once per outage.
	outage *delivery.Outage

	// run is the background loop's start and two-phase stop.
	run lifecycle.Runner

	mu sync.Mutex
	// epoch is the broker's epoch as last read (see currentEpoch).
	epoch string
	// unmarked and unreleased are rows of an earlier pass this relay
	// still holds because it could not record their outcome (the
	// database failed it): published and not marked, given back and not
	// released. The next pass records them first (settle), so their keys
	// go on as soon as the database is back rather than once the locks
	// lapse.
	unmarked, unreleased []int64

	// leaser is the store's RelayLeaser when the relay claims under a
	// lease (Options.LeaseFor), else nil; waker is its RelayWaker, if it
	// is one.
	leaser outbox.RelayLeaser
	waker  outbox.RelayWaker
	// lease is the broker's relay lease as this relay last learned it
	// (leading), read by Leading from other goroutines.
	lease struct {
		held atomic.Bool
		// until is when a held lease lapses unless renewed; next is
		// when to renew it, or to try to take it.
		until, next time.Time
	}
}

// New returns a Relay over store.
func New(store outbox.RelayStore, opts Options) *Relay {
	d := DefaultOptions()
	if opts.BatchSize <= 0 {
		opts.BatchSize = d.BatchSize
	}
	if opts.Tick <= 0 {
		opts.Tick = d.Tick
	}
	if opts.LockFor <= 0 {
		opts.LockFor = d.LockFor
	}
	if opts.BaseDelay <= 0 {
		opts.BaseDelay = d.BaseDelay
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = d.MaxDelay
	}
	if opts.BackfillSuffix == "" {
		opts.BackfillSuffix = d.BackfillSuffix
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.CleanupEvery <= 0 {
		opts.CleanupEvery = d.CleanupEvery
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	r := &Relay{store: store, opts: opts, wake: make(chan struct{}, 1), heard: make(chan struct{}, 1),
		outage: opts.Infra.Outage("outbox relay", opts.Logger, opts.Clock.Now),
		run:    lifecycle.Runner{Name: "outbox relay " + opts.Broker, Log: opts.Logger}}
	if l, ok := store.(outbox.RelayLeaser); ok && opts.LeaseFor > 0 {
		r.leaser = l
		r.waker, _ = store.(outbox.RelayWaker)
	}
	return r
}

// Notify wakes the relay for a pass now (the unit of work calls it after a
// commit), instead of at its next tick; a relay without its broker's lease
// wakes the lease's holder instead (outbox.RelayWaker).
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Start runs passes in the background until Stop. ctx's values are kept,
// its cancellation is not. A relay starts once: a second Start, or a Start
// after Stop, is an error (lifecycle.Runner).
func (r *Relay) Start(ctx context.Context) error { return r.run.Start(ctx, r.loop) }

// StopGrace is how long Stop waits, once its deadline has canceled the
// pass in progress, for that pass to return.
const StopGrace = lifecycle.Grace

// Stop stops the background passes in two phases. Soft: no new pass
// starts, and the pass in progress runs to its end (its rows are marked
// published or failed). Hard, if ctx ends first: the pass is canceled
// (rows it claimed and did not mark stay locked until LockFor passes,
// then are published again: at least once) and Stop waits at most
// StopGrace more for the loop to return, then returns ctx's error. Stop
// before Start, and a second Stop, are no-ops.
func (r *Relay) Stop(ctx context.Context) error { return r.run.Stop(ctx) }

// loop runs passes until soft ends; each pass runs on work, which only a
// hard stop cancels.
func (r *Relay) loop(soft, work context.Context) {
	var cleaned time.Time
	infra := 0 // consecutive passes failed on infrastructure
	// A pass's published rows are marked with the next pass's claim
	// (pass), which follows at once; what a stop leaves is marked here.
	defer func() {
		if err := r.settle(work, true); err != nil {
			r.opts.Logger.Warn("outbox relay: marking the last pass's rows at stop failed (their locks lapse, and they go again)", "broker", r.opts.Broker, "error", err)
		}
	}()
	defer r.release(work)
	var ears listener // the holder's, for the others' wakes
	defer ears.stop()
	for {
		if soft.Err() != nil {
			return
		}
		leading := r.leading(work)
		if r.waker != nil && leading {
			ears.start(work, func(ctx context.Context) {
				_ = r.waker.ListenRelayWakes(ctx, r.opts.Broker, r.opts.Logger, r.hear)
			})
		} else {
			ears.stop()
		}
		if !leading {
			// Another relay holds the broker's lease: claim nothing, and
			// try for it again when due. Rows an earlier pass left
			// unmarked are marked first. This host's commits wake the
			// holder.
			if err := r.settle(work, true); err != nil {
				r.opts.Logger.Warn("outbox relay: marking an earlier pass's rows failed", "broker", r.opts.Broker, "error", err)
			}
			select {
			case <-soft.Done():
				return
			case <-r.wake:
				if r.waker != nil {
					if err := r.waker.WakeRelay(work, r.opts.Broker); err != nil && work.Err() == nil {
						r.opts.Logger.Debug("outbox relay: waking the lease's holder failed (it passes at its tick)", "broker", r.opts.Broker, "error", err)
					}
				}
			case <-r.heard:
			case <-r.opts.Clock.After(r.lease.next.Sub(r.opts.Clock.Now())):
			}
			continue
		}
		if now := r.opts.Clock.Now(); now.Sub(cleaned) >= r.opts.CleanupEvery {
			cleaned = now
			if n, err := r.Cleanup(work); err != nil {
				r.opts.Logger.Warn("outbox cleanup failed", "broker", r.opts.Broker, "error", err)
			} else if n > 0 {
				r.opts.Logger.Info("outbox cleanup", "deleted", n)
			}
		}
		n, err := r.pass(work, true)
		if work.Err() != nil {
			return
		}
		wait := r.opts.Tick
		switch {
		case err == nil:
			infra = 0
			r.outage.OK()
		case delivery.IsInfrastructure(err):
			// The database or the broker is down: one line per outage,
			// and passes paced by the outage's length, not every tick.
			infra++
			r.outage.Fail(err, "broker", r.opts.Broker)
			wait = delivery.Policy{Jitter: r.opts.Jitter, Rand: r.opts.Rand}.InfraPause(infra)
		default:
			r.opts.Logger.Error("outbox relay pass failed", "broker", r.opts.Broker, "error", err)
		}
		if n > 0 && err == nil {
			continue // more may be waiting: go again at once
		}
		if r.leaser != nil && r.lease.held.Load() {
			wait = min(wait, max(r.lease.next.Sub(r.opts.Clock.Now()), 0)) // renew it in time
		}
		select {
		case <-soft.Done():
			return
		case <-r.wake:
		case <-r.heard:
		case <-r.opts.Clock.After(wait):
		}
	}
}

// listener is a goroutine that runs while the relay holds its lease.
type listener struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs listen in a goroutine of its own unless it runs already.
func (l *listener) start(ctx context.Context, listen func(context.Context)) {
	if l.cancel != nil {
		return
	}
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		listen(ctx)
	}()
}

// stop ends the goroutine, if it runs, and waits for it.
func (l *listener) stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	<-l.done
	l.cancel, l.done = nil, nil
}

// hear takes another relay's wake-up (outbox.RelayWaker): the holder of
// the lease passes at once.
func (r *Relay) hear() {
	select {
	case r.heard <- struct{}{}:
	default:
	}
}

// Leading reports whether the relay claims its broker's rows: it holds
// the broker's relay lease (Options.LeaseFor), as it last learned, or it
// holds none and claims whenever it runs. A relay that has not started
// leads nothing.
func (r *Relay) Leading() bool {
	if r.leaser == nil {
		return r.run.Running()
	}
	return r.lease.held.Load()
}

// leading reports whether the loop claims now, taking or renewing the
// broker's lease when due: the holder renews it every LeaseFor/3, the
// others try for it every LeaseFor/5. When the database does not answer,
// a holder goes on claiming until its lease would lapse (its claims fail
// too, and the loop backs off on them), and the others wait for the next
// try.
func (r *Relay) leading(ctx context.Context) bool {
	if r.leaser == nil {
		return true
	}
	now := r.opts.Clock.Now()
	if now.Before(r.lease.next) {
		if r.lease.held.Load() && !now.Before(r.lease.until) {
			r.lease.held.Store(false) // lapsed while the database did not answer
		}
		return r.lease.held.Load()
	}
	was := r.lease.held.Load()
	held, err := r.leaser.HoldRelay(ctx, r.opts.Broker, r.opts.Owner, r.opts.LeaseFor)
	switch {
	case err != nil:
		r.lease.next = now.Add(r.opts.LeaseFor / 5)
		held = was && now.Before(r.lease.until)
		if ctx.Err() == nil {
			r.outage.Fail(delivery.MarkInfrastructure(fmt.Errorf("relay lease: %w", err)), "broker", r.opts.Broker)
		}
	case held:
		r.lease.until, r.lease.next = now.Add(r.opts.LeaseFor), now.Add(r.opts.LeaseFor/3)
	default:
		r.lease.next = now.Add(r.opts.LeaseFor / 5)
	}
	if err == nil && !held {
		r.outage.OK() // a holder's passes report its outages
	}
	if held != was {
		if held {
			r.opts.Logger.Info("outbox relay: holds the broker's relay lease, claims its rows", "broker", r.opts.Broker, "owner", r.opts.Owner)
		} else {
			r.opts.Logger.Info("outbox relay: another relay holds the broker's relay lease; claims nothing until it lapses", "broker", r.opts.Broker, "owner", r.opts.Owner)
		}
		r.lease.held.Store(held)
	}
	return held
}

// release gives the broker's lease up as the loop ends, so that another
// host's relay takes it at its next try rather than after it lapses.
func (r *Relay) release(ctx context.Context) {
	if r.leaser == nil || !r.lease.held.Load() {
		return
	}
	r.lease.held.Store(false)
	if err := r.leaser.ReleaseRelay(ctx, r.opts.Broker, r.opts.Owner); err != nil {
		r.opts.Logger.Warn("outbox relay: giving up the broker's relay lease failed (it lapses)", "broker", r.opts.Broker, "error", err)
	}
}

// Cleanup deletes published and abandoned rows older than their retention
// (a retention of 0 keeps them) and returns how many it deleted. The
// background loop runs it every CleanupEvery.
func (r *Relay) Cleanup(ctx context.Context) (int, error) {
	now := r.opts.Clock.Now()
	var published, abandoned time.Time // the zero time deletes nothing
	if r.opts.PublishedRetention > 0 {
		published = now.Add(-r.opts.PublishedRetention)
	}
	if r.opts.AbandonedRetention > 0 {
		abandoned = now.Add(-r.opts.AbandonedRetention)
	}
	if published.IsZero() && abandoned.IsZero() {
		return 0, nil
	}
	return r.store.Cleanup(ctx, published, abandoned)
}

// RunOnce claims one batch and settles each row: rows go to the broker in
// claim order (each key's run in commit order); when a row fails on its
// own account, it is marked failed (halted past its retries, if it has a
// partition key) and the rest of its key's run is released unpublished,
// so they wait behind it; when the broker fails (down, restarting,
// refusing writes), the row and every row after it are released untried
// and uncounted, and RunOnce returns the failure marked as infrastructure
// (delivery.IsInfrastructure), so the loop backs off; the published rows
// are marked in one step. A row is published only while the claim holds
// it with time to spare (see lapsed). It returns how many rows it claimed.
func (r *Relay) RunOnce(ctx context.Context) (int, error) { return r.pass(ctx, false) }

// pass is RunOnce. With next (the background loop, which runs the next
// pass at once after a clean one that claimed rows), a store that can
// mark with its claim (outbox.MarkingClaimer) marks a clean pass's
// published rows with the next pass's claim, one round trip instead of
// two: they are held as unmarked until then, as rows whose mark failed
// are.
func (r *Relay) pass(ctx context.Context, next bool) (int, error) {
	mc, marking := r.store.(outbox.MarkingClaimer)
	marking = marking && next
	if err := r.settle(ctx, !marking); err != nil {
		return 0, delivery.MarkInfrastructure(err)
	}
	// The epoch is read before the claim: a publish under it is refused
	// once the broker lost its data, even after another relay marked it
	// anew (its rows made pending again must go out first). After the
	// broker failed it is read from the broker again, which claims nothing
	// while the broker is still down.
	epoch, err := r.currentEpoch(ctx)
	if err != nil {
		err = fmt.Errorf("epoch: %w", err)
		if marking { // no claim to mark them with: mark them now
			err = errors.Join(err, r.settle(ctx, true))
		}
		return 0, delivery.MarkInfrastructure(err)
	}
	partitioning := r.opts.Publisher.Capabilities().Has(broker.StreamPartitioning)
	var rows []outbox.Row
	if marking {
		rows, err = r.markAndClaim(ctx, mc, partitioning)
	} else {
		rows, err = r.claim(ctx, partitioning)
	}
	if err != nil {
		return 0, delivery.MarkInfrastructure(err)
	}
	p := &pass{failedKeys: map[outbox.OrderingKey]bool{}, deferMark: marking}
	// Every row becomes a message first (a row with a key the rules
	// reject is abandoned and holds its key back for this pass), then the
	// claim goes to the broker in one call, in claim order: all or
	// nothing. Only if the broker refuses one of them (broker.ErrInvalid)
	// does the pass publish them one by one, to charge the refused row
	// and hold back its key's later rows.
	batch, msgs := r.messages(ctx, p, rows, partitioning)
	if partitioning {
		chain(batch, msgs)
	}
	switch {
	case len(batch) == 0:
	case r.lapsed(batch[0]):
		// Too late to publish under this claim: another relay may take
		// these rows now. Give back what is still ours.
		p.released = append(p.released, rowIDs(batch)...)
	default:
		pctx, span := startPublish(ctx, msgs)
		err := r.send(pctx, epoch, msgs...)
		telemetry.End(span, err)
		switch {
		case err == nil:
			p.published = append(p.published, rowIDs(batch)...)
		case !errors.Is(err, broker.ErrInvalid):
			// The broker's failure, not the rows': never counted.
			p.down = delivery.MarkInfrastructure(fmt.Errorf("publish %d rows: %w", len(batch), err))
			p.released = append(p.released, rowIDs(batch)...)
		default:
			r.publishEach(ctx, p, batch, msgs, epoch)
		}
	}
	r.end(ctx, p)
	return len(rows), errors.Join(p.errs...)
}

// startPublish starts the span of a publish of msgs (docs/tracing.md):
// publish {category} (publish, when they are of several), a producer span
// linked to each message's creation context. The messages keep theirs:
// no intermediary changes it.
func startPublish(ctx context.Context, msgs []delivery.Message) (context.Context, trace.Span) {
	if !telemetry.Enabled() {
		return ctx, trace.SpanFromContext(context.Background()) // records nothing
	}
	mds := make([]json.RawMessage, len(msgs))
	name, cat := "publish", msgs[0].Category
	for i, m := range msgs {
		mds[i] = m.Metadata
		if m.Category != cat {
			cat = ""
		}
	}
	if cat != "" {
		name += " " + cat
	}
	ctx, span := telemetry.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(telemetry.Links(mds...)...))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("messaging.operation.name", "publish"), attribute.String("messaging.operation.type", "send"),
			attribute.Int("messaging.batch.message_count", len(msgs)))
		if cat != "" {
			span.SetAttributes(attribute.String("messaging.destination.name", cat))
		}
	}
	return ctx, span
}

// pass is what one RunOnce does with its claim.
type pass struct {
	published, released []int64
	errs                []error
	// down is the broker's failure: the rest of the claim goes back
	// untried.
	down error
	// failedKeys are the keys a row failed on: their later rows wait.
	failedKeys map[outbox.OrderingKey]bool
	// deferMark leaves the marks of a clean pass to the next pass's claim.
	deferMark bool
}

// messages turns the claimed rows into messages, in claim order; a row
// whose key failed earlier in the pass is released, and a row with a key
// the rules reject is abandoned (r.message) and holds its key back.
func (r *Relay) messages(ctx context.Context, p *pass, rows []outbox.Row, partitioning bool) ([]outbox.Row, []delivery.Message) {
	var batch []outbox.Row
	var msgs []delivery.Message
	for _, row := range rows {
		k := outbox.OrderingKeyOf(&row)
		if p.failedKeys[k] {
			p.released = append(p.released, row.ID)
			continue
		}
		msg, ok, err := r.message(ctx, row, partitioning)
		if !ok {
			if err != nil {
				p.errs = append(p.errs, err)
			}
			p.failedKeys[k] = true
			continue
		}
		batch, msgs = append(batch, row), append(msgs, msg)
	}
	return batch, msgs
}

// publishEach publishes the batch one row at a time, after the broker
// refused the whole (broker.ErrInvalid): a refused row is charged and
// holds its key's later rows back, and a broker failure releases the
// rest untried.
func (r *Relay) publishEach(ctx context.Context, p *pass, batch []outbox.Row, msgs []delivery.Message, epoch string) {
	for i, row := range batch {
		k := outbox.OrderingKeyOf(&row)
		if p.down != nil || p.failedKeys[k] || r.lapsed(row) {
			p.released = append(p.released, row.ID)
			continue
		}
		ok, err := r.publishOne(ctx, row, msgs[i], epoch)
		switch {
		case ok:
			p.published = append(p.published, row.ID)
		case delivery.IsInfrastructure(err):
			p.down = err
			p.released = append(p.released, row.ID)
		default:
			if err != nil {
				p.errs = append(p.errs, err)
			}
			p.failedKeys[k] = true
		}
	}
}

// end marks the pass's published rows in one step and releases the rest;
// after a broker failure it forgets the epoch, and republishes when the
// broker lost its data.
func (r *Relay) end(ctx context.Context, p *pass) {
	if err := r.store.Release(ctx, r.opts.Owner, p.released); err != nil {
		r.hold(&r.unreleased, p.released, err)
		p.errs = append(p.errs, delivery.MarkInfrastructure(fmt.Errorf("release: %w", err)))
	}
	if p.deferMark && p.down == nil && len(p.errs) == 0 {
		// A clean pass: the loop runs the next at once, whose claim
		// marks these.
		r.hold(&r.unmarked, p.published, nil)
	} else if err := r.store.MarkPublishedBatch(ctx, r.opts.Owner, p.published); err != nil {
		// Published but not marked: the next pass marks them (settle);
		// should another relay take them first (the locks lapsed), they
		// go again, and consumers see a duplicate, never a loss.
		r.hold(&r.unmarked, p.published, err)
		p.errs = append(p.errs, delivery.MarkInfrastructure(fmt.Errorf("mark published: %w", err)))
	}
	if p.down == nil {
		return
	}
	// The broker failed: forget its epoch, so that the next pass reads it
	// again before it claims anything. While the broker is away a pass
	// costs that one read, not a claim of rows it cannot publish (a claim
	// walks the backlog the outage builds), and the first pass after its
	// return learns whether it kept its data.
	r.setEpoch("")
	if errors.Is(p.down, broker.ErrEpochLost) || errors.Is(p.down, broker.ErrRestarted) {
		if err := r.republish(ctx); err != nil {
			p.errs = append(p.errs, delivery.MarkInfrastructure(fmt.Errorf("%w (republishing: %v)", p.down, err)))
		}
		// Republished and marked: the next pass publishes.
		return
	}
	p.errs = append(p.errs, p.down)
}

// rowIDs are the rows' ids, in order.
func rowIDs(rows []outbox.Row) []int64 {
	out := make([]int64, len(rows))
	for i, row := range rows {
		out[i] = row.ID
	}
	return out
}

// claim claims the next rows; on a partitioning broker, with each row's
// Prev when the store can tell (outbox.Chainer).
func (r *Relay) claim(ctx context.Context, partitioning bool) ([]outbox.Row, error) {
	var rows []outbox.Row
	var err error
	if c, ok := r.store.(outbox.Chainer); ok && partitioning {
		rows, err = c.ClaimChained(ctx, r.opts.Broker, r.opts.Owner, r.opts.BatchSize, r.opts.LockFor, r.lanes())
	} else {
		rows, err = r.store.Claim(ctx, r.opts.Broker, r.opts.Owner, r.opts.BatchSize, r.opts.LockFor)
	}
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return rows, nil
}

// markAndClaim marks the rows published and not marked yet (the last
// pass's, or an earlier one's whose mark failed) and claims the next
// rows, in one round trip (claim's rows). Rows another relay took over
// are dropped; if the round trip fails, they are held for the next pass.
func (r *Relay) markAndClaim(ctx context.Context, mc outbox.MarkingClaimer, partitioning bool) ([]outbox.Row, error) {
	r.mu.Lock()
	unmarked := r.unmarked
	r.unmarked = nil
	r.mu.Unlock()
	var lanes *outbox.Lanes
	if _, ok := r.store.(outbox.Chainer); ok && partitioning {
		l := r.lanes()
		lanes = &l
	}
	rows, markErr, err := mc.MarkAndClaim(ctx, r.opts.Owner, unmarked, r.opts.Broker, r.opts.BatchSize, r.opts.LockFor, lanes)
	if err != nil {
		r.hold(&r.unmarked, unmarked, err)
		return nil, fmt.Errorf("mark published and claim: %w", err)
	}
	_ = markErr // outbox.ErrNotOwner: those rows are another relay's now
	return rows, nil
}

// chain sets each partitioned message's Prev, the global position of the
// message before it on its stream: the claim's previous message on that
// stream if it has one, else the row's Prev (the newest published row of
// its key on that stream, as the claim read it).
func chain(batch []outbox.Row, msgs []delivery.Message) {
	last := map[string]int64{} // stream -> global position of its latest message in the claim
	for i := range batch {
		if batch[i].PartitionKey == nil {
			continue
		}
		msgs[i].Prev = batch[i].Prev
		if p, seen := last[msgs[i].Stream]; seen {
			msgs[i].Prev = p
		}
		last[msgs[i].Stream] = msgs[i].GlobalPosition
	}
}

// hold keeps ids (in *list) for the next pass to record, unless the
// failure says they are no longer this relay's.
func (r *Relay) hold(list *[]int64, ids []int64, err error) {
	if errors.Is(err, outbox.ErrNotOwner) {
		return // some were taken over: the rest lapse with their locks
	}
	r.mu.Lock()
	*list = append(*list, ids...)
	r.mu.Unlock()
}

// settle records what an earlier pass could not: rows published and not
// marked are marked published (with marks; else the pass's claim marks
// them: markAndClaim), rows given back and not released are
// released. Rows another relay took over meanwhile (outbox.ErrNotOwner) are
// dropped from the lists; any other failure keeps them and fails the pass.
func (r *Relay) settle(ctx context.Context, marks bool) error {
	r.mu.Lock()
	var unmarked []int64
	if marks { // else the claim marks them (markAndClaim)
		unmarked, r.unmarked = r.unmarked, nil
	}
	unreleased := r.unreleased
	r.unreleased = nil
	r.mu.Unlock()
	if len(unmarked) > 0 {
		if err := r.store.MarkPublishedBatch(ctx, r.opts.Owner, unmarked); err != nil {
			r.hold(&r.unmarked, unmarked, err)
			if !errors.Is(err, outbox.ErrNotOwner) {
				r.hold(&r.unreleased, unreleased, nil)
				return fmt.Errorf("mark published (an earlier pass's rows): %w", err)
			}
		}
	}
	if len(unreleased) > 0 {
		if err := r.store.Release(ctx, r.opts.Owner, unreleased); err != nil {
			r.hold(&r.unreleased, unreleased, err)
			if !errors.Is(err, outbox.ErrNotOwner) {
				return fmt.Errorf("release (an earlier pass's rows): %w", err)
			}
		}
	}
	return nil
}

// republish answers a broker that lost its data (its epoch marker is
// gone, so it takes no publish): every row published within the published
// retention is made pending again, in commit order, ahead of every later
// row, then the broker gets a new marker and publishes resume. Consumers
// that applied a row already recognise it by their positions (a
// partition worker acks it unhandled); what the broker lost reaches them
// in order. Rows published before the retention are gone from the outbox
// and cannot be published again: Redis must persist (docs/operations.md,
// "Redis must persist what it acknowledges").
//
// When the broker kept its marker but restarted since it was set (or
// failed over): what it acknowledged last may be gone (an fsync
// policy other than always, a replica behind its primary), so the rows
// published within RestartWindow before the broker's last publish go
// again the same way (the broker drops those it still holds, by message
// id), before the new marker.
func (r *Relay) republish(ctx context.Context) error {
	ep, ok := r.opts.Publisher.(broker.Epocher)
	store, ok2 := r.store.(outbox.Republisher)
	if !ok || !ok2 {
		return errors.New("the broker or the store cannot republish")
	}
	// What the broker holds now decides what it needs: a NOEPOCH may be
	// only this relay's stale epoch (another relay marked it since), or a
	// marker set before a restart, which needs the restart's window, not
	// the whole retention.
	cur, again, err := ep.Epoch(ctx)
	if err != nil {
		return err
	}
	if cur != "" && !again {
		r.setEpoch(cur)
		return nil
	}
	restarted := cur != ""
	var since time.Time // zero: every published row still kept
	if restarted {
		last, err := store.LastPublished(ctx, r.opts.Broker)
		if err != nil {
			return err
		}
		since = r.opts.Clock.Now()
		if !last.IsZero() {
			since = last.Add(-r.opts.RestartWindow)
		}
	} else if r.opts.PublishedRetention > 0 {
		since = r.opts.Clock.Now().Add(-r.opts.PublishedRetention)
	}
	// Two relays that meet the loss at once may both republish (the first
	// marks the broker after its commit): the second requeues what the
	// first has sent again since, which the broker drops by message id.
	epoch, marked, moved := owner.New(), "", false
	n, first, err := store.Republish(ctx, r.opts.Broker, epoch, since, r.keep(), func(ctx context.Context) (bool, error) {
		cur, again, err := ep.Epoch(ctx)
		if err != nil {
			return false, err
		}
		switch {
		case cur != "" && !again:
			marked = cur // another relay republished and marked it first
			return false, nil
		case restarted && cur == "":
			moved = true // it lost its marker meanwhile: a later pass republishes it all
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	if marked != "" {
		r.setEpoch(marked)
		return nil
	}
	if moved {
		return fmt.Errorf("broker %s lost its epoch marker while republishing after its restart", r.opts.Broker)
	}
	if err := ep.SetEpoch(ctx, epoch); err != nil {
		return err
	}
	r.setEpoch(epoch)
	switch {
	case first:
		r.opts.Logger.Info("outbox relay: broker marked with its first epoch", "broker", r.opts.Broker, "epoch", epoch)
	case restarted:
		r.opts.Logger.Warn("outbox relay: the broker restarted; rows published shortly before its last publish are published again",
			"broker", r.opts.Broker, "rows", n, "since", since, "restart_window", r.opts.RestartWindow, "epoch", epoch)
	default:
		r.opts.Logger.Warn("outbox relay: the broker lost its data; rows published within the retention are published again",
			"broker", r.opts.Broker, "rows", n, "since", since, "epoch", epoch)
	}
	return nil
}

// currentEpoch is the broker's epoch as this relay last read it, read
// (and, if the broker has none or restarted since it was set, made:
// republish) when it has none; "" for a publisher without epochs.
func (r *Relay) currentEpoch(ctx context.Context) (string, error) {
	ep, ok := r.opts.Publisher.(broker.Epocher)
	if !ok {
		return "", nil
	}
	if e := r.getEpoch(); e != "" {
		return e, nil
	}
	e, restarted, err := ep.Epoch(ctx)
	if err != nil {
		return "", err
	}
	if e == "" || restarted {
		if err := r.republish(ctx); err != nil {
			return "", err
		}
		return r.getEpoch(), nil
	}
	r.setEpoch(e)
	return e, nil
}

func (r *Relay) getEpoch() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.epoch
}

func (r *Relay) setEpoch(e string) {
	r.mu.Lock()
	r.epoch = e
	r.mu.Unlock()
}

// lapsed reports whether row's claim is too close to its end to publish
// under: a relay stalled past its claim (a long pause, a stopped process)
// must not publish a row another relay may have taken over and published
// later rows of its key past. The check uses this host's clock, with a
// quarter of LockFor to spare; the broker's drop of a message id it holds
// already and the consumers' position check catch what slips past it.
func (r *Relay) lapsed(row outbox.Row) bool {
	if row.LockedUntil == nil {
		return false
	}
	return !r.opts.Clock.Now().Add(r.opts.LockFor / 4).Before(*row.LockedUntil)
}

// message is row as the broker takes it. It reports false for a row it
// abandoned: one with a partition key the rules reject.
func (r *Relay) message(ctx context.Context, row outbox.Row, partitioning bool) (delivery.Message, bool, error) {
	// The publish-time backstop: a row that reached here with a key the
	// rules reject is abandoned at once, never retried: no stream can
	// take it, so it cannot wedge its key.
	if partitioning && row.PartitionKey != nil {
		if reason := partition.KeyReason(*row.PartitionKey, r.opts.BackfillSuffix); reason != "" {
			r.opts.Logger.Warn("outbox row abandoned: invalid partition key", "id", row.ID, "reason", reason)
			if err := r.store.Abandon(ctx, row.ID, "Invalid partition key: "+reason); err != nil {
				return delivery.Message{}, false, fmt.Errorf("row %d: abandon: %w", row.ID, err)
			}
			return delivery.Message{}, false, nil
		}
	}
	msg := delivery.Message{ID: row.MessageID, Stream: r.stream(row, partitioning), Type: row.Type, Data: row.Data,
		Metadata: row.Metadata, EventStream: row.Stream, Category: row.Category}
	if row.PartitionKey != nil {
		msg.PartitionKey = *row.PartitionKey
	}
	if err := fillPositions(&msg); err != nil {
		// The unit of work writes this metadata and refuses one it cannot
		// encode, so this is a row from elsewhere: publish it (its
		// payload is intact) but say its positions are unknown.
		r.opts.Logger.Warn("outbox row metadata unreadable: positions left zero", "id", row.ID, "message_id", row.MessageID, "error", err)
	}
	return msg, true, nil
}

// send publishes msgs in one call, in order, all or nothing, under epoch
// when the publisher has epochs.
func (r *Relay) send(ctx context.Context, epoch string, msgs ...delivery.Message) error {
	if ep, ok := r.opts.Publisher.(broker.Epocher); ok && epoch != "" {
		return ep.PublishIn(ctx, epoch, msgs...)
	}
	return r.opts.Publisher.Publish(ctx, msgs...)
}

// publishOne publishes one row's message. It reports whether the row was
// published; a row the broker refused (broker.ErrInvalid) has been marked
// failed or halted (or, if even that failed, stays locked until its lock
// expires). A failure of the broker is returned marked as infrastructure,
// and nothing is marked: the caller releases the row.
func (r *Relay) publishOne(ctx context.Context, row outbox.Row, msg delivery.Message, epoch string) (bool, error) {
	err := r.send(ctx, epoch, msg)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, broker.ErrInvalid) {
		// The broker's failure, not the row's: never counted.
		return false, delivery.MarkInfrastructure(fmt.Errorf("row %d: publish: %w", row.ID, err))
	}
	next := r.opts.Clock.Now().Add(Backoff(row.RetryCount+1, r.opts.BaseDelay, r.opts.MaxDelay, r.opts.Jitter, r.opts.Rand))
	r.opts.Logger.Warn("outbox publish refused", "id", row.ID, "message_id", row.MessageID, "retry_count", row.RetryCount+1,
		"max_retries", row.MaxRetries, "error", err)
	if merr := r.store.MarkFailed(ctx, row.ID, r.opts.Owner, err.Error(), next); merr != nil {
		return false, fmt.Errorf("row %d: mark failed: %w", row.ID, merr)
	}
	return false, nil
}

// stream routes a row: its category, or on a partitioning broker its
// partition stream {category}:{key}, on the backfill lane when priority
// lanes are on and its priority is below the threshold.
func (r *Relay) stream(row outbox.Row, partitioning bool) string {
	if !partitioning || row.PartitionKey == nil {
		return row.Category
	}
	return r.lanes().Stream(row)
}

func (r *Relay) lanes() outbox.Lanes {
	return outbox.Lanes{Enabled: r.opts.LanesEnabled, Threshold: r.opts.LaneThreshold, Suffix: r.opts.BackfillSuffix}
}

// keep is what a republish may leave published: nothing unless the broker
// partitions (the partition workers' positions say what they applied).
func (r *Relay) keep() outbox.Keep {
	if r.opts.Partitions == nil || !r.opts.Publisher.Capabilities().Has(broker.StreamPartitioning) {
		return outbox.Keep{}
	}
	return outbox.KeepFor(r.opts.Partitions(), r.lanes())
}

// fillPositions copies the event's positions and time from the row's
// metadata (the unit of work writes them there) onto the message, or
// says why it cannot.
func fillPositions(m *delivery.Message) error {
	var md struct {
		Position       int64     `json:"position"`
		GlobalPosition int64     `json:"global_position"`
		Time           time.Time `json:"time"`
	}
	if len(m.Metadata) == 0 {
		return nil
	}
	if err := json.Unmarshal(m.Metadata, &md); err != nil {
		return fmt.Errorf("message %s: metadata: %w", m.ID, err)
	}
	m.Position, m.GlobalPosition, m.Time = md.Position, md.GlobalPosition, md.Time
	return nil
}
