package host

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/proteanhq/protean-host/internal/lifecycle"
)

// Outcome is what a reload did.
type Outcome string

// Reload outcomes.
const (
	// Applied: a valid, changed set was handed to the apply function.
	Applied Outcome = "applied"
	// Unchanged: the directory holds the modules already running.
	Unchanged Outcome = "unchanged"
	// Rejected: the new set has problems; the running set stays.
	Rejected Outcome = "rejected"
)

// Reloader reloads a plugins directory as a whole: on Reload, and, once
// started, whenever a *.wasm file in it changes (after a quiet period, so a
// file being copied is read once it is complete). Every reload loads and
// validates the whole set, exactly as at start; a valid set that differs
// from the running one goes to apply, and a set with problems is logged,
// problem by problem, while the running set keeps serving.
type Reloader struct {
	loader *Loader
	dir    string
	broker Broker
	apply  func(*Set)
	log    *slog.Logger
	quiet  time.Duration
	// Observe, if set, sees every reload's outcome (for metrics).
	observe func(Outcome)

	mu      sync.Mutex // serialises reloads
	current string     // fingerprint of the running set

	run struct {
		sync.Mutex
		// stop ends the watch (soft); cancel a reload in progress (hard).
		stop, cancel context.CancelFunc
		done         chan struct{}
	}
}

// ReloaderOptions configure a Reloader.
type ReloaderOptions struct {
	Loader *Loader
	Dir    string
	Broker Broker
	// Running is the set already running (its fingerprint makes an
	// unchanged directory a no-op).
	Running *Set
	// Apply takes a new, valid set; it then owns it.
	Apply func(*Set)
	// Observe sees each reload's outcome.
	Observe func(Outcome)
	Logger  *slog.Logger
	// Quiet is how long the directory must be still before a watched
	// change reloads (default 250 ms).
	Quiet time.Duration
}

// NewReloader returns a Reloader.
func NewReloader(o ReloaderOptions) *Reloader {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Quiet <= 0 {
		o.Quiet = 250 * time.Millisecond
	}
	r := &Reloader{loader: o.Loader, dir: o.Dir, broker: o.Broker, apply: o.Apply, log: o.Logger, quiet: o.Quiet, observe: o.Observe}
	if o.Running != nil {
		r.current = fingerprint(o.Running)
	}
	return r
}

// fingerprint identifies a set by its files and their contents.
func fingerprint(s *Set) string {
	parts := make([]string, len(s.Modules()))
	for i, m := range s.Modules() {
		parts[i] = m.File + "=" + m.SHA256
	}
	sort.Strings(parts)
	return strings.Join(parts, ";")
}

// Reload loads and validates the directory now. It returns the outcome and,
// when Rejected, every problem.
func (r *Reloader) Reload(ctx context.Context) (Outcome, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set, errs := LoadSet(ctx, r.loader, r.dir, r.broker)
	out := Applied
	switch {
	case len(errs) > 0:
		out = Rejected
		for _, err := range errs {
			r.log.Error("plugin reload rejected; the running set stays", "dir", r.dir, "problem", err.Error())
		}
	case fingerprint(set) == r.current:
		out = Unchanged
		_ = set.Close(ctx)
	default:
		r.current = fingerprint(set)
		r.log.Info("plugins reloaded", "dir", r.dir, "modules", len(set.Modules()))
		r.apply(set)
	}
	if r.observe != nil {
		r.observe(out)
	}
	return out, errs
}

// Start watches the directory until Stop. ctx's values are kept, its
// cancellation is not. Starting twice is an error.
func (r *Reloader) Start(ctx context.Context) error {
	r.run.Lock()
	defer r.run.Unlock()
	if r.run.cancel != nil {
		return errors.New("plugin reloader: already started")
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(r.dir); err != nil {
		_ = w.Close()
		return err
	}
	base := context.WithoutCancel(ctx)
	soft, stop := context.WithCancel(base)
	work, cancel := context.WithCancel(base)
	r.run.stop, r.run.cancel, r.run.done = stop, cancel, make(chan struct{})
	go r.watch(soft, work, w, r.run.done)
	return nil
}

// StopGrace is how long Stop waits, once its deadline has canceled a
// reload in progress, for the watch to return.
const StopGrace = lifecycle.Grace

// Stop ends the watch in two phases. Soft: no new reload starts, and a
// reload in progress finishes (a valid set is applied). Hard, if ctx ends
// first: the reload is canceled (loading stops; nothing is applied) and
// Stop waits at most StopGrace more, then returns ctx's error. Stop before
// Start, and a second Stop, are no-ops.
func (r *Reloader) Stop(ctx context.Context) error {
	r.run.Lock()
	stop, cancel, done := r.run.stop, r.run.cancel, r.run.done
	r.run.stop, r.run.cancel = nil, nil
	r.run.Unlock()
	if cancel == nil {
		return nil
	}
	stop()
	defer cancel()
	err := lifecycle.Wait(ctx, done, cancel)
	if errors.Is(err, lifecycle.ErrAbandoned) {
		r.log.Warn("plugin reloader stop: the reload in progress did not return after cancel", "dir", r.dir, "grace", StopGrace)
		return ctx.Err()
	}
	return err
}

// watch reloads on changes until soft ends; reloads run on work, which only
// a hard stop cancels.
func (r *Reloader) watch(soft, work context.Context, w *fsnotify.Watcher, done chan struct{}) {
	defer close(done)
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-soft.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Ext(ev.Name) == ".wasm" {
				timer.Reset(r.quiet) // wait until the directory is still
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			r.log.Warn("plugin watch error", "dir", r.dir, "error", err)
		case <-timer.C:
			r.Reload(work)
		}
	}
}
