package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/proteanhq/protean-host/clock"
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
	// Canceled: the reload was canceled (a shutdown); nothing changed.
	Canceled Outcome = "canceled"
)

// Reloader reloads a plugins directory as a whole: on Reload, and, once
// started, whenever a *.wasm file in it changes (after a quiet period, so a
// file being copied is read once it is complete). Every reload loads and
// validates the whole set, exactly as at start; a valid set that differs
// from the running one goes to apply, and a set with problems is logged,
// problem by problem, while the running set keeps serving. A module whose
// file is unchanged (same name, same SHA-256) is carried into the new set
// as it runs, not compiled and instantiated again, so a reload costs what
// the changed files cost.
//
// Each reload says what it did: per module added, changed or removed, its
// file, old and new version and SHA-256, and the time the reload took;
// "plugins unchanged" when nothing changed; "plugins directory valid
// again" on the first good reload after a rejected one. Status returns
// the last reload for GET /v1/plugins and the status page.
type Reloader struct {
	loader *Loader
	dir    string
	broker Broker
	apply  func(*Set)
	log    *slog.Logger
	quiet  time.Duration
	// Observe, if set, sees every reload's outcome (for metrics).
	observe func(Outcome)
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time

	// allowRepartition lets a reload change a live category's partition
	// key (ReloaderOptions.AllowRepartition).
	allowRepartition bool

	mu      sync.Mutex // serialises reloads
	running *Set       // the set last applied (or given as Running)
	current string     // fingerprint of the running set

	status struct {
		sync.Mutex
		last *ReloadStatus
	}

	// run is the watch's start and two-phase stop.
	run lifecycle.Runner
}

// ReloaderOptions configure a Reloader.
type ReloaderOptions struct {
	Loader *Loader
	Dir    string
	Broker Broker
	// Running is the set already running (its fingerprint makes an
	// unchanged directory a no-op, and its unchanged modules are carried
	// into the next set).
	Running *Set
	// Apply takes a new, valid set; it then owns it. The set may share
	// modules with the one it replaces: closing the old set leaves them
	// running (see Module.Close).
	Apply func(*Set)
	// Observe sees each reload's outcome.
	Observe func(Outcome)
	// AllowRepartition lets a reload change the partition key of a
	// category the running set has (its sequential_by field, or whether
	// it is partitioned at all). By default such a reload is rejected
	// (RuleRepartition): on Redis it re-partitions a live category, and
	// two events of one entity may then sit in two partitions, one under
	// the old key and one under the new, and run out of order. Allow it
	// for a deploy whose category is drained: no writes to it, and every
	// partition of it handled (docs/operations.md, "Changing a category's
	// partition key").
	AllowRepartition bool
	Logger           *slog.Logger
	// Quiet is how long the directory must be still before a watched
	// change reloads (default DefaultQuiet).
	Quiet time.Duration
	// Clock is what reloads are timed with and what the quiet period
	// waits on (nil: clock.System).
	Clock clock.Clock
}

// DefaultQuiet is the default quiet period of a watched directory: long
// enough for a copy in progress to go quiet, short against the reload
// itself. An atomic rename (write elsewhere, mv into the directory) needs
// none.
const DefaultQuiet = 100 * time.Millisecond

// NewReloader returns a Reloader.
func NewReloader(o ReloaderOptions) *Reloader {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Quiet <= 0 {
		o.Quiet = DefaultQuiet
	}
	o.Clock = clock.Or(o.Clock)
	r := &Reloader{loader: o.Loader, dir: o.Dir, broker: o.Broker, apply: o.Apply, log: o.Logger, quiet: o.Quiet,
		observe: o.Observe, now: o.Clock.Now, after: o.Clock.After, running: o.Running, allowRepartition: o.AllowRepartition, run: lifecycle.Runner{Name: "plugin reloader", Log: o.Logger}}
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

// ReloadStatus is what the last reload did.
type ReloadStatus struct {
	At      time.Time
	Outcome Outcome
	Took    time.Duration
	// Changes lists the modules the reload added, changed or removed
	// (Applied only).
	Changes []ModuleChange
	// Problems are a rejected reload's problems, each naming its file
	// where it has one.
	Problems []FileProblem
}

// ModuleChange is one module a reload added, changed or removed: Old is
// zero for an added module, New for a removed one.
type ModuleChange struct {
	File string        `json:"file"`
	Old  ModuleVersion `json:"old"`
	New  ModuleVersion `json:"new"`
}

// ModuleVersion is a module's name, version and file digest.
type ModuleVersion struct {
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
}

// FileProblem is one problem of a rejected reload; File is "" for a
// problem of the directory or the set as a whole.
type FileProblem struct {
	File  string `json:"file,omitempty"`
	Error string `json:"error"`
}

// Status returns the last reload's status, or nil before the first.
func (r *Reloader) Status() *ReloadStatus {
	r.status.Lock()
	defer r.status.Unlock()
	if r.status.last == nil {
		return nil
	}
	st := *r.status.last
	return &st
}

func versionOf(m *Module) ModuleVersion {
	return ModuleVersion{Name: m.Manifest.Module.Name, Version: m.Manifest.Module.Version, SHA256: m.SHA256}
}

// changes lists what differs between the modules of old and new, by file.
func changes(old, new *Set) []ModuleChange {
	was := map[string]*Module{}
	if old != nil {
		for _, m := range old.Modules() {
			was[m.File] = m
		}
	}
	var out []ModuleChange
	for _, m := range new.Modules() {
		o, ok := was[m.File]
		delete(was, m.File)
		switch {
		case !ok:
			out = append(out, ModuleChange{File: m.File, New: versionOf(m)})
		case o.SHA256 != m.SHA256:
			out = append(out, ModuleChange{File: m.File, Old: versionOf(o), New: versionOf(m)})
		}
	}
	for _, o := range was {
		out = append(out, ModuleChange{File: o.File, Old: versionOf(o)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out
}

// problemFile is the file a load error or validation problem names.
func problemFile(err error) string {
	var le *LoadError
	if errors.As(err, &le) {
		return le.File
	}
	var p *Problem
	if errors.As(err, &p) {
		return p.File
	}
	return ""
}

// Reload loads and validates the directory now. It returns the outcome and,
// when Rejected, every problem.
func (r *Reloader) Reload(ctx context.Context) (Outcome, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := r.now()
	set, errs := loadSet(ctx, r.loader, r.dir, r.broker, r.running)
	st := &ReloadStatus{At: start, Outcome: Applied}
	prev := r.Status()
	wasRejected := prev != nil && prev.Outcome == Rejected
	var moved []error // running categories whose partition key the new set changes
	if len(errs) == 0 && set != nil {
		moved = repartitions(r.running, set)
	}
	switch {
	case ctx.Err() != nil:
		st.Outcome = Canceled
		st.Took = r.now().Sub(start)
		if set != nil {
			_ = set.Close(context.Background())
		}
		r.log.Warn("plugin reload canceled; the running set stays", "dir", r.dir, "error", ctx.Err())
	case len(moved) > 0 && !r.allowRepartition:
		errs = moved
		_ = set.Close(context.Background())
		fallthrough
	case len(errs) > 0:
		st.Outcome = Rejected
		st.Took = r.now().Sub(start)
		for _, err := range errs {
			st.Problems = append(st.Problems, FileProblem{File: problemFile(err), Error: err.Error()})
			r.log.Error("plugin reload rejected; the running set stays", "dir", r.dir, "file", problemFile(err), "problem", err.Error())
		}
	case fingerprint(set) == r.current:
		st.Outcome = Unchanged
		_ = set.Close(ctx) // drops the holds on the carried modules
		st.Took = r.now().Sub(start)
		r.log.Info("plugins unchanged", "dir", r.dir, "modules", len(set.Modules()), "took", st.Took)
	default:
		for _, err := range moved {
			p := err.(*Problem)
			r.log.Warn("plugin reload re-partitions a live category (allow_repartition is set): per-key order across the switch holds only for a drained category",
				"category", p.Type, "file", p.File, "change", p.Msg)
		}
		st.Changes = changes(r.running, set)
		r.current = fingerprint(set)
		r.running = set
		r.apply(set)
		st.Took = r.now().Sub(start)
		for _, c := range st.Changes {
			r.log.Info("plugin "+c.verb(), "file", c.File, "module", c.name(),
				"old_version", c.Old.Version, "new_version", c.New.Version,
				"old_sha256", c.Old.SHA256, "new_sha256", c.New.SHA256)
		}
		r.log.Info("plugins reloaded", "dir", r.dir, "modules", len(set.Modules()), "changed", len(st.Changes), "took", st.Took)
	}
	if wasRejected && st.Outcome != Rejected {
		r.log.Info("plugins directory valid again", "dir", r.dir, "outcome", string(st.Outcome))
	}
	r.status.Lock()
	r.status.last = st
	r.status.Unlock()
	if r.observe != nil {
		r.observe(st.Outcome)
	}
	return st.Outcome, errs
}

// repartitions lists the categories of the running set whose partition
// key next changes (a different sequential_by field, or partitioned in one
// set and not in the other), one *Problem each (RuleRepartition), naming
// the file that declares the new key (or, for a key dropped, the old one).
func repartitions(running, next *Set) []error {
	if running == nil || next == nil {
		return nil
	}
	had := categories(running)
	has := categories(next)
	oldKeys, newKeys := running.Keys(), next.Keys()
	var out []error
	for _, c := range slices.Sorted(maps.Keys(had)) {
		if !has[c] {
			continue // the category leaves the set: nothing runs on it
		}
		o, ok1 := oldKeys[c]
		n, ok2 := newKeys[c]
		if ok1 == ok2 && o.Field == n.Field {
			continue
		}
		describe := func(k PartitionKey, ok bool) string {
			if !ok {
				return "not partitioned"
			}
			return fmt.Sprintf("sequential_by %s (handler %s in %s)", k.Field, k.Handler, k.File)
		}
		file := n.File
		if !ok2 {
			file = o.File
		}
		out = append(out, &Problem{Rule: RuleRepartition, File: file, Type: c, Field: n.Field,
			Msg: fmt.Sprintf("category %s would change its partition key from %s to %s while it runs: on Redis two events of one entity could then sit in two partitions and run out of order; "+
				"drain the category (stop its writes, let every partition catch up) and reload with [plugins] allow_repartition = true, or keep the key",
				c, describe(o, ok1), describe(n, ok2))})
	}
	return out
}

// categories lists the stream categories a set's handlers read or write.
func categories(s *Set) map[string]bool {
	out := map[string]bool{}
	for _, m := range s.Modules() {
		for _, h := range m.Manifest.Handlers {
			if h.Category != "" {
				out[h.Category] = true
			}
			for _, t := range h.Handles {
				if msg, ok := s.Message(t); ok && msg.Category != "" {
					out[msg.Category] = true
				}
			}
		}
	}
	return out
}

func (c ModuleChange) verb() string {
	switch {
	case c.Old.SHA256 == "":
		return "added"
	case c.New.SHA256 == "":
		return "removed"
	}
	return "changed"
}

func (c ModuleChange) name() string {
	if c.New.Name != "" {
		return c.New.Name
	}
	return c.Old.Name
}

// Start watches the directory until Stop. ctx's values are kept, its
// cancellation is not. A reloader starts once: a second Start, or a Start
// after Stop, is an error (lifecycle.Runner).
func (r *Reloader) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := w.Add(r.dir); err != nil {
		_ = w.Close()
		return err
	}
	if err := r.run.Start(ctx, func(soft, work context.Context) { r.watch(soft, work, w) }); err != nil {
		_ = w.Close()
		return err
	}
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
func (r *Reloader) Stop(ctx context.Context) error { return r.run.Stop(ctx) }

// watch reloads on changes until soft ends; reloads run on work, which only
// a hard stop cancels.
func (r *Reloader) watch(soft, work context.Context, w *fsnotify.Watcher) {
	defer w.Close()
	// quiet fires once the directory has been still for r.quiet since
	// its last change (nil: no change pending). Each change waits anew;
	// a superseded wait is dropped.
	var quiet <-chan time.Time
	for {
		select {
		case <-soft.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Ext(ev.Name) == ".wasm" {
				quiet = r.after(r.quiet) // wait until the directory is still
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			r.log.Warn("plugin watch error", "dir", r.dir, "error", err)
		case <-quiet:
			quiet = nil
			r.Reload(work)
		}
	}
}
