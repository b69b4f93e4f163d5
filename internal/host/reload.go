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
	// Rejected: the running set stays: the directory has problems, and
	// either nothing valid could be composed or every changed file was
	// held back.
	Rejected Outcome = "rejected"
	// Canceled: the reload was canceled (a shutdown); nothing changed.
	Canceled Outcome = "canceled"
	// Partial: a valid, changed set was applied, and some files were
	// held back (their running versions, if any, stay): see
	// ReloadStatus.Rejected.
	Partial Outcome = "partial"
)

// Reloader reloads a plugins directory: on Reload, and, once started,
// whenever a *.wasm file in it changes (after a quiet period, so a file
// being copied is read once it is complete). Every reload loads the whole
// directory and validates the set, exactly as at start, but composes it
// per module (candidate.go): a file that does not load, or that the set's
// problems are attributed to, is held back (its running version, if any,
// keeps serving, and the file is reported as rejected), while the other
// files go live as they are. One bad file does not hide a good edit of
// another module. When nothing valid can be composed, the whole reload is
// rejected and the running set keeps serving. A module whose file is
// unchanged (same name, same SHA-256) is carried into the new set as it
// runs, not compiled and instantiated again, so a reload costs what the
// changed files cost.
//
// Each reload says what it did: per module added, changed or removed, its
// file, old and new version and SHA-256, and the time the reload took;
// "plugins unchanged" when nothing changed; each file held back with its
// problem; "plugins directory valid again" on the first reload without a
// problem after one with. Status returns the last reload, and the files
// rejected now, for GET /v1/plugins and the status page.
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
	// rejected are the files rejected now (ReloadStatus.Rejected).
	rejected map[string]Rejection

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
	// Problems are the reload's problems (Rejected, Partial), each naming
	// its file where it has one.
	Problems []FileProblem
	// Rejected are the files of the directory that are rejected now, by
	// file: held back by this reload, or rejected by it as a whole. A
	// file leaves the list once a version of it loads, or it is removed.
	Rejected []Rejection
}

// Rejection is a file of the plugins directory a reload refused. A module
// that runs from the file keeps serving its running version.
type Rejection struct {
	File string `json:"file"`
	// Tenant is the tenant the file's module belongs to by config (its
	// name without ".wasm" in a [tenants.NAME] modules list, else
	// DefaultTenant): whose deploy was refused.
	Tenant string `json:"tenant"`
	SHA256 string `json:"sha256,omitempty"`
	Error  string `json:"error"`
	// At is when these bytes of the file were first rejected.
	At time.Time `json:"at"`
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

// ProblemFile is the file a reload's problem names: a *LoadError's or a
// *Problem's ("" for the directory or the set as a whole).
func ProblemFile(err error) string {
	var he *HeldError
	if errors.As(err, &he) {
		return he.File
	}
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

// Reload loads and validates the directory now, composing the set per
// module (candidate.go): a file that does not load, or that a problem of
// the set is attributed to, is held back (its running version, if any,
// keeps serving) while the other files change as they are. It returns the
// outcome and every problem: of the files held back (Partial, Rejected),
// or of the whole directory (Rejected).
func (r *Reloader) Reload(ctx context.Context) (Outcome, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start := r.now()
	mods, errs := r.loader.loadDir(ctx, r.dir, r.running)
	st := &ReloadStatus{At: start}
	prev := r.Status()
	hadProblems := prev != nil && len(prev.Problems) > 0
	var c composed
	switch {
	case ctx.Err() != nil:
		st.Outcome = Canceled
		closeModules(mods)
	case slices.ContainsFunc(errs, func(err error) bool { return ProblemFile(err) == "" }):
		// The directory itself failed (unreadable, no *.wasm files):
		// nothing is composed.
		closeModules(mods)
		c = composed{whole: errs}
		errs = nil
	default:
		c = compose(r.running, mods, errs, r.validate)
	}
	if c.whole != nil {
		errs = append(errs, c.whole...)
	} else {
		for _, f := range slices.Sorted(maps.Keys(c.rejected)) {
			for _, err := range c.rejected[f] {
				if !slices.Contains(errs, err) { // a load error is in errs already
					errs = append(errs, err)
				}
			}
		}
	}
	for _, err := range errs {
		st.Problems = append(st.Problems, FileProblem{File: ProblemFile(err), Error: err.Error()})
	}
	switch {
	case st.Outcome == Canceled:
		r.log.Warn("plugin reload canceled; the running set stays", "dir", r.dir, "error", ctx.Err())
	case c.set == nil:
		st.Outcome = Rejected
		for _, err := range errs {
			r.log.Error("plugin reload rejected; the running set stays", "dir", r.dir, "file", ProblemFile(err), "problem", err.Error())
		}
	case fingerprint(c.set) == r.current:
		st.Outcome = Unchanged
		_ = c.set.Close(ctx) // drops the holds on the carried modules
		if len(errs) > 0 {
			st.Outcome = Rejected // every changed file was held back
			r.logHeldBack(errs)
		} else {
			r.log.Info("plugins unchanged", "dir", r.dir, "modules", len(c.set.Modules()), "took", r.now().Sub(start))
		}
	default:
		st.Outcome = Applied
		if len(errs) > 0 {
			st.Outcome = Partial
			r.logHeldBack(errs)
		}
		r.applySet(c.set, st)
	}
	st.Took = r.now().Sub(start)
	if st.Outcome != Canceled {
		r.rejected = rejections(r.rejected, c, st.At, r.tenantOfFile)
	}
	st.Rejected = slices.Collect(maps.Values(r.rejected))
	sort.Slice(st.Rejected, func(i, j int) bool { return st.Rejected[i].File < st.Rejected[j].File })
	if hadProblems && (st.Outcome == Applied || st.Outcome == Unchanged) {
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

// validate checks a candidate set as at start, but for a category two
// tenants claim, which stays with its running owner (ValidateTenantsOver),
// and, unless allowRepartition, against the running set's partition keys.
func (r *Reloader) validate(mods []*Module) (*Set, []error) {
	var owners *Ownership
	if r.running != nil {
		owners = r.running.Owners()
	}
	set, problems := newTenantSet(mods, r.broker, r.loader.tenancy.Grants, owners)
	var errs []error
	for _, p := range problems {
		errs = append(errs, p)
	}
	if len(errs) == 0 && !r.allowRepartition {
		errs = repartitions(r.running, set)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return set, nil
}

// applySet makes set the running set and logs what changed.
func (r *Reloader) applySet(set *Set, st *ReloadStatus) {
	start := r.now()
	for _, err := range repartitions(r.running, set) { // only when allowed
		p := err.(*Problem)
		r.log.Warn("plugin reload re-partitions a live category (allow_repartition is set): per-key order across the switch holds only for a drained category",
			"category", p.Type, "file", p.File, "change", p.Msg)
	}
	st.Changes = changes(r.running, set)
	r.current = fingerprint(set)
	r.running = set
	r.apply(set)
	for _, c := range st.Changes {
		r.log.Info("plugin "+c.verb(), "file", c.File, "module", c.name(),
			"old_version", c.Old.Version, "new_version", c.New.Version,
			"old_sha256", c.Old.SHA256, "new_sha256", c.New.SHA256)
	}
	r.log.Info("plugins reloaded", "dir", r.dir, "modules", len(set.Modules()), "changed", len(st.Changes), "took", r.now().Sub(start))
}

// logHeldBack logs the problems of the files a reload held back.
func (r *Reloader) logHeldBack(errs []error) {
	for _, err := range errs {
		f := ProblemFile(err)
		r.log.Error("plugin file rejected; its running version, if any, stays", "dir", r.dir, "file", f, "tenant", r.tenantOfFile(f), "problem", err.Error())
	}
}

// tenantOfFile is the tenant a file's module belongs to by config, as the
// loader assigns it ("" for no file).
func (r *Reloader) tenantOfFile(file string) string {
	if file == "" {
		return ""
	}
	return r.loader.tenancy.of(moduleName(file))
}

func closeModules(mods []*Module) {
	for _, m := range mods {
		_ = m.Close(context.Background())
	}
}

// rejections returns the files a reload left rejected: those it held
// back, and those it rejected as a whole, each keeping the time it was
// first rejected at while its bytes stay the same. A file that loads, or
// leaves the directory, is no longer rejected.
func rejections(was map[string]Rejection, c composed, at time.Time, tenant func(file string) string) map[string]Rejection {
	out := map[string]Rejection{}
	for f, errs := range c.rejected {
		msgs := make([]string, len(errs))
		for i, err := range errs {
			msgs[i] = err.Error()
		}
		rj := Rejection{File: f, Tenant: tenant(f), SHA256: c.sums[f], Error: strings.Join(msgs, "; "), At: at}
		if old, ok := was[f]; ok && old.SHA256 == rj.SHA256 {
			rj.At = old.At
		}
		out[f] = rj
	}
	return out
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
