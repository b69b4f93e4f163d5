package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/atomicfile"
	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/host"
)

// Audit actions.
const (
	ActionPut      = "modules.put"
	ActionRemove   = "modules.remove"
	ActionRollback = "modules.rollback"
)

// HistoryDir is the directory of the plugins directory that keeps earlier
// versions. Its leading dot keeps it out of the loader's listing (which
// reads only entries named *.wasm) and out of the watcher's (which reacts
// only to *.wasm names, and does not watch subdirectories).
const HistoryDir = ".history"

// Defaults of Options.
const (
	DefaultKeep           = 5
	DefaultMaxModuleBytes = 64 << 20
)

// Sentinel errors.
var (
	// ErrInvalidName: a module name that is empty, too long, starts with a
	// dot or a dash, or holds anything but letters, digits, '_', '-' and
	// '.' (so no path separator).
	ErrInvalidName = errors.New("invalid module name")
	// ErrNotFound: no module of that name in the plugins directory.
	ErrNotFound = errors.New("no such module")
	// ErrTooLarge: a module over Options.MaxModuleBytes.
	ErrTooLarge = errors.New("module too large")
	// ErrNoHistory: a rollback with no earlier version to go back to.
	ErrNoHistory = errors.New("no earlier version of the module")
	// ErrRead: the module's bytes could not be read (the client's body
	// broke off).
	ErrRead = errors.New("reading the module's bytes")
	// ErrNotRegular: the module's path holds something other than a
	// regular file (a link, a directory), which a deploy does not replace.
	ErrNotRegular = errors.New("not a regular file")
)

// RejectedError is a change the reload did not accept (Rejected, or
// Canceled): the plugins directory was put back as it was. Problems are
// the reload's, each naming its file where it has one.
type RejectedError struct {
	Module   string
	Outcome  host.Outcome
	Problems []error
}

func (e *RejectedError) Error() string {
	msg := fmt.Sprintf("module %s: reload %s, the previous version is back", e.Module, e.Outcome)
	if len(e.Problems) > 0 {
		msg += ": " + e.Problems[0].Error()
		if n := len(e.Problems) - 1; n > 0 {
			msg += fmt.Sprintf(" (and %d more)", n)
		}
	}
	return msg
}

// Unwrap returns the problems.
func (e *RejectedError) Unwrap() []error { return e.Problems }

// Options configure a Deployer.
type Options struct {
	// Dir is the plugins directory.
	Dir string
	// Reload reloads and validates the whole directory
	// (host.Reloader.Reload).
	Reload func(ctx context.Context) (host.Outcome, []error)
	// TenantOf returns a module's tenant by name ("": host.DefaultTenant).
	TenantOf func(module string) string
	// Audit records each action.
	Audit audit.Log
	// Keep is how many earlier versions of each module stay in history
	// (DefaultKeep if zero or less).
	Keep int
	// MaxModuleBytes bounds a module (DefaultMaxModuleBytes if zero or
	// less).
	MaxModuleBytes int64
	// Now times the history (nil: time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Deployer changes the modules of the plugins directory, one action at a
// time, each validated by a reload of the whole directory.
type Deployer struct {
	o  Options
	mu sync.Mutex // serialises the actions
}

// New returns a Deployer.
func New(o Options) *Deployer {
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if o.MaxModuleBytes <= 0 {
		o.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Deployer{o: o}
}

// Result is what an action left in place.
type Result struct {
	Name    string       `json:"name"`
	Tenant  string       `json:"tenant"`
	SHA256  string       `json:"sha256,omitempty"` // "" once removed
	Size    int64        `json:"size"`
	Outcome host.Outcome `json:"outcome"`
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// CheckName returns the module name of name (its ".wasm" suffix, if any,
// dropped), or an error wrapping ErrInvalidName.
func CheckName(name string) (string, error) {
	n := strings.TrimSuffix(name, ".wasm")
	if !namePattern.MatchString(n) {
		return "", fmt.Errorf("%w %q: use 1 to 128 letters, digits, '_', '-' or '.', not starting with '.' or '-'", ErrInvalidName, clip(name))
	}
	return n, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// TenantOf returns the tenant of module name.
func (d *Deployer) TenantOf(name string) string {
	n := strings.TrimSuffix(name, ".wasm")
	if d.o.TenantOf != nil {
		if t := d.o.TenantOf(n); t != "" {
			return t
		}
	}
	return host.DefaultTenant
}

// MaxModuleBytes is the largest module Put accepts.
func (d *Deployer) MaxModuleBytes() int64 { return d.o.MaxModuleBytes }

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (d *Deployer) path(name string) string { return filepath.Join(d.o.Dir, name+".wasm") }

// record appends the action's audit entry. A failure to record is logged:
// the action is done (or undone) by then and its answer stands.
func (d *Deployer) record(ctx context.Context, principal, action, name, sha string, err error) {
	target := name
	if sha != "" {
		target += " sha256:" + sha[:12]
	}
	tenant := ""
	if _, nerr := CheckName(name); nerr == nil {
		tenant = d.TenantOf(name)
	}
	e := audit.Entry{Principal: principal, Tenant: tenant, Action: action, Target: target, Outcome: audit.Outcome(err)}
	if _, aerr := d.o.Audit.Append(context.WithoutCancel(ctx), e); aerr != nil {
		d.o.Logger.Error("deploy: audit entry not recorded", "action", action, "module", name, "error", aerr)
	}
}

// Put makes wasm the module name: it keeps the current version in
// history, writes the new one atomically and reloads. A reload that does
// not accept it puts the previous version back (or removes the new file)
// and returns a *RejectedError.
func (d *Deployer) Put(ctx context.Context, principal, name string, wasm io.Reader) (res Result, err error) {
	var sha string
	defer func() { d.record(ctx, principal, ActionPut, name, sha, err) }()
	n, err := CheckName(name)
	if err != nil {
		return Result{}, err
	}
	name = n
	// Read before taking the lock: a slow client holds no other deploy.
	b, err := io.ReadAll(io.LimitReader(wasm, d.o.MaxModuleBytes+1))
	if err != nil {
		return Result{}, fmt.Errorf("module %s: %w: %w", name, ErrRead, err)
	}
	if int64(len(b)) > d.o.MaxModuleBytes {
		return Result{}, fmt.Errorf("module %s: %w: over %d bytes", name, ErrTooLarge, d.o.MaxModuleBytes)
	}
	sha = sum(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.current(name)
	if err != nil {
		return Result{}, err
	}
	out, err := d.swap(ctx, name, cur, b)
	if err != nil {
		return Result{}, err
	}
	return Result{Name: name, Tenant: d.TenantOf(name), SHA256: sha, Size: int64(len(b)), Outcome: out}, nil
}

// Remove moves the module name into history and reloads; a reload that
// does not accept its absence puts it back and returns a *RejectedError.
func (d *Deployer) Remove(ctx context.Context, principal, name string) (res Result, err error) {
	var sha string
	defer func() { d.record(ctx, principal, ActionRemove, name, sha, err) }()
	n, err := CheckName(name)
	if err != nil {
		return Result{}, err
	}
	name = n
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.current(name)
	if err != nil {
		return Result{}, err
	}
	if cur == nil {
		return Result{}, fmt.Errorf("module %s: %w", name, ErrNotFound)
	}
	sha = sum(cur)
	out, err := d.swap(ctx, name, cur, nil)
	if err != nil {
		return Result{}, err
	}
	return Result{Name: name, Tenant: d.TenantOf(name), Outcome: out}, nil
}

// Rollback puts back the newest version in history that differs from the
// current one (a removed module's last version too), validated as Put;
// the current version goes into history.
func (d *Deployer) Rollback(ctx context.Context, principal, name string) (res Result, err error) {
	var sha string
	defer func() { d.record(ctx, principal, ActionRollback, name, sha, err) }()
	n, err := CheckName(name)
	if err != nil {
		return Result{}, err
	}
	name = n
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.current(name)
	if err != nil {
		return Result{}, err
	}
	vs, err := d.history(name)
	if err != nil {
		return Result{}, err
	}
	curSum := ""
	if cur != nil {
		curSum = sum(cur)
	}
	for i := len(vs) - 1; i >= 0; i-- {
		v := vs[i]
		if v.SHA256 == curSum {
			continue
		}
		b, err := os.ReadFile(v.path)
		if err != nil {
			return Result{}, fmt.Errorf("module %s: reading history: %w", name, err)
		}
		sha = sum(b)
		out, err := d.swap(ctx, name, cur, b)
		if err != nil {
			return Result{}, err
		}
		// The version now running leaves history (the one it replaced
		// went in), so history holds each version once.
		if err := os.Remove(v.path); err != nil {
			d.o.Logger.Warn("deploy: history version not removed", "module", name, "path", v.path, "error", err)
		}
		return Result{Name: name, Tenant: d.TenantOf(name), SHA256: sha, Size: int64(len(b)), Outcome: out}, nil
	}
	return Result{}, fmt.Errorf("module %s: %w", name, ErrNoHistory)
}

// current returns the module's bytes, nil if it has no file.
func (d *Deployer) current(name string) ([]byte, error) {
	p := d.path(name)
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("module %s: %s is %w; change it by hand", name, p, ErrNotRegular)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", name, err)
	}
	return b, nil
}

// swap makes the module's file hold next (nil: no file), cur (nil: none)
// going into history, and reloads. A reload that does not accept it puts
// cur back and takes its history entry out again; the restoring reload
// runs past ctx's cancellation, so the status the reloader reports is the
// directory's again.
func (d *Deployer) swap(ctx context.Context, name string, cur, next []byte) (host.Outcome, error) {
	var kept string
	if cur != nil && (next == nil || !bytes.Equal(cur, next)) {
		var err error
		if kept, err = d.keep(name, cur); err != nil {
			return "", err
		}
	}
	undoKeep := func() {
		if kept != "" {
			_ = os.Remove(kept)
		}
	}
	if err := d.put(name, next); err != nil {
		undoKeep()
		return "", err
	}
	out, errs := d.o.Reload(ctx)
	if accepted(out, errs, name+".wasm") {
		d.prune(name)
		return out, nil
	}
	if len(errs) == 0 {
		errs = []error{fmt.Errorf("reload %s: %w", out, context.Cause(ctx))}
	}
	rej := &RejectedError{Module: name, Outcome: out, Problems: errs}
	if err := d.put(name, cur); err != nil {
		return out, errors.Join(rej, fmt.Errorf("module %s: the previous version could not be put back: %w", name, err))
	}
	undoKeep()
	// A rejection of the restoring reload that names other files only is
	// theirs (held back beside the module's restored, running bytes).
	ours := func(err error) bool { f := host.ProblemFile(err); return f == "" || f == name+".wasm" }
	if back, berrs := d.o.Reload(context.WithoutCancel(ctx)); back == host.Rejected && slices.ContainsFunc(berrs, ours) {
		d.o.Logger.Error("deploy: the restored plugins directory is rejected too", "module", name, "problems", errors.Join(berrs...))
	}
	return out, rej
}

// accepted reports whether a reload took the module's file as it is now:
// applied or unchanged with no problem, or applied in part (host.Partial)
// with no problem naming the file, the problems being other files' (held
// back by the reload while this change went live).
func accepted(out host.Outcome, errs []error, file string) bool {
	switch out {
	case host.Applied, host.Unchanged:
		return len(errs) == 0
	case host.Partial:
		return !slices.ContainsFunc(errs, func(err error) bool { return host.ProblemFile(err) == file })
	}
	return false
}

// put writes b as the module's file atomically (nil: removes it): a
// temporary file not named *.wasm, synced, renamed over the module, and
// the directory synced.
func (d *Deployer) put(name string, b []byte) error {
	p := d.path(name)
	if b == nil {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("module %s: %w", name, err)
		}
		return atomicfile.SyncDir(d.o.Dir)
	}
	if err := atomicfile.WriteFile(p, b, 0o644); err != nil {
		return fmt.Errorf("module %s: %w", name, err)
	}
	return nil
}
