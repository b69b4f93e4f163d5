package host

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/instrument"
)

// Limits bound what a module may use. Zero fields take the defaults of
// DefaultLimits.
type Limits struct {
	// MemoryMB caps a module instance's linear memory.
	MemoryMB int
	// Timeout bounds one call into a module (a batch of messages).
	Timeout time.Duration
	// ManifestTimeout bounds the protean_manifest call at load.
	ManifestTimeout time.Duration
	// MaxOutputBytes caps what one protean_handle call may return.
	MaxOutputBytes int
	// MaxTableElements caps every table a module defines (table.grow
	// allocates 8 host bytes per element outside linear memory): a table
	// declaring more is refused at load, one declaring no maximum gets
	// this one.
	MaxTableElements int
	// MaxModuleBytes caps a module file's size.
	MaxModuleBytes int
	// CompileTimeout bounds compiling a module at load, per MiB of module
	// (at least once): a compile bomb (a small module that takes minutes,
	// such as thousands of nested blocks) that the shape limits below let
	// through is refused, a large honest module is not. A shutdown never
	// waits for a compilation.
	CompileTimeout time.Duration
	// MaxFunctions, MaxFunctionBytes, MaxFunctionLocals,
	// MaxModuleLocals, MaxNestingDepth and MaxNestingCost bound a
	// module's shape, checked before it is compiled (see
	// instrument.Limits): compiling cannot be interrupted, and its time
	// grows with the square of a function's nesting, so a compile bomb
	// refused only by CompileTimeout would still burn a core for minutes
	// in the background.
	MaxFunctions, MaxFunctionBytes, MaxFunctionLocals, MaxModuleLocals, MaxNestingDepth, MaxNestingCost int
	// RecycleAboveMB: an instance whose memories (its own and the Extism
	// kernel's) grew past this is closed after its call instead of going
	// back to the pool, so a pool does not keep a burst's memory forever.
	RecycleAboveMB int
	// InstanceIdle closes an instance that sat idle this long, so a
	// module that runs rarely, or less at once than it once did, gives
	// back its instances' memory (4-8 MB each for a Go guest); the next
	// call makes one again, as the first call after load does. 0 takes
	// DefaultLimits'; negative keeps idle instances until the module
	// closes.
	InstanceIdle time.Duration
	// CodeIdle releases a module's compiled code (about 24 MB for a Go
	// guest) once it has had no instance and no call this long; the
	// next call compiles it again, from the compiled-code cache on disk
	// (codeidle.go). Only with a cache directory; 0 (the default) or
	// negative keeps the code while the module is loaded.
	CodeIdle time.Duration
	// LogsPerSecond and LogBurst bound the guest log lines a module may
	// forward to the host log; the rest are dropped and counted.
	LogsPerSecond, LogBurst int
	// MaxHostCalls bounds the host-function calls (load, read_stream)
	// of one protean_handle call; MaxHostBytes the bytes they answer in
	// all; MaxReadBytes the bytes of events one read_stream page holds
	// (budget.go).
	MaxHostCalls, MaxHostBytes, MaxReadBytes int
	// Instances caps the module's instances alive at once, and so its
	// concurrent calls (0: the loader's Instances, GOMAXPROCS by
	// default); a call beyond waits for one within its deadline.
	Instances int
	// Uninterruptible turns deadline enforcement off: the module runs as
	// it is, about 1.05-1.2x faster than instrumented (docs/deadline.md),
	// but nothing can stop a runaway call, and a call that outlives
	// Timeout still counts. For trusted modules only. (The zero value, the
	// safe one, enforces deadlines.)
	Uninterruptible bool
	// RuntimeDeadline enforces the deadline with wazero's
	// close-on-context-done instead of instrumenting the module (see
	// DeadlineRuntime): the fallback for a module the rewriter refuses,
	// and the baseline the benchmarks compare against. Not in config.
	RuntimeDeadline bool
}

// DefaultLimits are the limits a module gets when config says nothing.
func DefaultLimits() Limits {
	return Limits{MemoryMB: 64, Timeout: 5 * time.Second, ManifestTimeout: 2 * time.Second, MaxOutputBytes: abi.DefaultMaxOutputBytes,
		MaxTableElements: 100_000, MaxModuleBytes: 32 << 20, CompileTimeout: 10 * time.Second, RecycleAboveMB: 32,
		InstanceIdle: time.Minute, LogsPerSecond: 10, LogBurst: 100,
		// A batch of a few hundred messages loading a few records each,
		// and reading a few long streams.
		MaxHostCalls: 10_000, MaxHostBytes: 64 << 20, MaxReadBytes: 1 << 20,
		// Measured (docs/deadline.md, Compile bombs): Go wasip1 modules
		// have ~2,500 functions, bodies up to 50 KiB, 20 locals (10,600
		// in all), nesting 549 and a nesting cost of 4.6M; Haskell 1,706
		// deep; TinyGo, Rust, Zig and C under 40 deep.
		MaxFunctions: 100_000, MaxFunctionBytes: 1 << 20, MaxFunctionLocals: 50_000, MaxModuleLocals: 1_000_000,
		MaxNestingDepth: 8192, MaxNestingCost: 100_000_000}
}

// shape is the limits on a module's shape, for package instrument.
func (l Limits) shape() instrument.Limits {
	return instrument.Limits{MaxFunctions: l.MaxFunctions, MaxFunctionBytes: l.MaxFunctionBytes, MaxLocals: l.MaxFunctionLocals,
		MaxModuleLocals: l.MaxModuleLocals, MaxNestingDepth: l.MaxNestingDepth, MaxNestingCost: l.MaxNestingCost}
}

// compileDeadline is CompileTimeout per started MiB of a module of size
// bytes.
func (l Limits) compileDeadline(size int) time.Duration {
	return l.CompileTimeout * time.Duration(max(1, (size+1<<20-1)>>20))
}

// instanceBudget is what the memories of one instance may hold together:
// memory_mb for the module's own, and room in the Extism kernel's for a
// batch's input and its output.
func (l Limits) instanceBudget() uint64 {
	return uint64(l.MemoryMB)<<20 + 2*uint64(l.MaxOutputBytes)
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MemoryMB <= 0 {
		l.MemoryMB = d.MemoryMB
	}
	if l.Timeout <= 0 {
		l.Timeout = d.Timeout
	}
	if l.ManifestTimeout <= 0 {
		l.ManifestTimeout = d.ManifestTimeout
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxTableElements <= 0 {
		l.MaxTableElements = d.MaxTableElements
	}
	if l.MaxModuleBytes <= 0 {
		l.MaxModuleBytes = d.MaxModuleBytes
	}
	if l.CompileTimeout <= 0 {
		l.CompileTimeout = d.CompileTimeout
	}
	for _, f := range []struct {
		v *int
		d int
	}{{&l.MaxFunctions, d.MaxFunctions}, {&l.MaxFunctionBytes, d.MaxFunctionBytes},
		{&l.MaxFunctionLocals, d.MaxFunctionLocals}, {&l.MaxModuleLocals, d.MaxModuleLocals},
		{&l.MaxNestingDepth, d.MaxNestingDepth}, {&l.MaxNestingCost, d.MaxNestingCost},
		{&l.MaxHostCalls, d.MaxHostCalls}, {&l.MaxHostBytes, d.MaxHostBytes}, {&l.MaxReadBytes, d.MaxReadBytes}} {
		if *f.v <= 0 {
			*f.v = f.d
		}
	}
	if l.RecycleAboveMB <= 0 {
		l.RecycleAboveMB = d.RecycleAboveMB
	}
	if l.InstanceIdle == 0 {
		l.InstanceIdle = d.InstanceIdle
	}
	if l.LogsPerSecond <= 0 {
		l.LogsPerSecond = d.LogsPerSecond
	}
	if l.LogBurst <= 0 {
		l.LogBurst = d.LogBurst
	}
	return l
}

// Module is a loaded, compiled module and what it declares.
type Module struct {
	// File is the module's file name within the plugins directory.
	File string
	// Path is where it was loaded from.
	Path string
	// SHA256 is the hex digest of the file's bytes.
	SHA256 string
	// Manifest is what the module declared.
	Manifest *abi.Manifest
	// Limits are the limits its instances run under.
	Limits Limits
	// Tenant is the tenant the module belongs to (DefaultTenant unless
	// config lists it under another).
	Tenant string

	// Deadline is how the module's call deadline is enforced:
	// DeadlineInstrumented, DeadlineRuntime or DeadlineOff; "" until the
	// first compile of a module a start loaded from its protean.manifest
	// section (lazySection). Set before any instance is made.
	Deadline string

	pool *pool
	// recompile compiles the module's code again after a release (nil:
	// the code is never released, see Limits.CodeIdle).
	recompile func(context.Context) (*compiledCode, error)
	log       *slog.Logger
	v2        sync.Map // *extism.Plugin → *instanceV2, for ABI v2 modules (abiv2.go)
	hasStart  bool     // instrumented, with its start section exported (see attach)
	// stat is the file as it was when loaded: a reload that finds the
	// same file (same inode, size and modification time) carries the
	// module without reading it again.
	stat os.FileInfo
	// refs counts the holders of the module: 1 at load, one more for each
	// reload that carries it, unchanged, into a new set (see retain). The
	// last Close releases it, so the set a reload retires can be closed
	// while its successor keeps running the modules they share.
	refs atomic.Int32
	logs *logLimiter
	// reaper closes the pool's instances idle past Limits.InstanceIdle.
	reaper *reaper
	// share is the module's tenant's share of the guest slots (nil: the
	// loader shares none, see LoaderOptions.GuestConcurrency).
	share *Share
	// uncache tells the compiled-code cache the module is no longer
	// loaded (nil without a bounded cache, see cacheDir).
	uncache func()
	// fromMemo: the module was loaded from its manifest memo (memo.go),
	// memo names that memo (relative to the cache directory; "" for a
	// module compiled at load); warming is set while its code is compiled
	// in the background (warm.go).
	fromMemo bool
	memo     string
	warming  atomic.Bool
	// source is what a module loaded without its code (lazy) keeps to
	// compile it, packed after the directory load (packLater); nil for
	// code never released, which drops it after its first compile.
	source *source
	// fromSection: the manifest was read from the module's
	// protean.manifest section at a start, nothing compiled or run.
	fromSection bool
	// manifestJSON is Manifest's bytes (see ManifestJSON).
	manifestJSON []byte
}

// ManifestJSON returns the manifest's bytes as the module answered them
// (or as its memo or its protean.manifest section holds them, which say
// the same). Not to be modified.
func (m *Module) ManifestJSON() []byte { return m.manifestJSON }

// retain adds a holder, unless the module has been released already.
func (m *Module) retain() bool {
	for {
		n := m.refs.Load()
		if n <= 0 {
			return false
		}
		if m.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Close drops one holder; the last releases the module's compiled code
// and runtime.
func (m *Module) Close(ctx context.Context) error {
	if m.pool == nil || m.refs.Add(-1) > 0 {
		return nil
	}
	m.reaper.remove(m)
	c := m.pool.closeIdle(ctx)
	m.pool.mu.Lock() // (a module loaded from its section sets it at its first compile)
	uncache := m.uncache
	m.uncache = nil
	m.pool.mu.Unlock()
	if uncache != nil {
		uncache()
	}
	if c == nil { // released, or being compiled again (loadCode closes it)
		return nil
	}
	return c.close(ctx)
}

// LoadError is a module file that could not be loaded.
type LoadError struct {
	File string
	// SHA256 is the digest of the file's bytes, when they were read ("" if
	// the file could not be opened or read).
	SHA256 string
	Err    error
}

func (e *LoadError) Error() string { return e.File + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *LoadError) Unwrap() error { return e.Err }

// Sentinel causes of a LoadError.
var (
	ErrEmptyFile       = errors.New("empty file")
	ErrNotWASM         = abi.ErrNotModule // one error, whichever reader found it
	ErrNoManifest      = errors.New("module does not export " + abi.ExportManifest)
	ErrManifestTimeout = errors.New(abi.ExportManifest + " did not return in time")
	ErrManifestFailed  = errors.New(abi.ExportManifest + " failed")
	// ErrManifestSection is a module whose protean.manifest section
	// (abi.ManifestSection) does not say what its protean_manifest
	// answers.
	ErrManifestSection = errors.New("the " + abi.ManifestSection + " section differs from what " + abi.ExportManifest +
		" answers; embed it again: protean-host plugin embed-manifest FILE")
)

// Loader loads modules: it compiles them (through a compilation cache when
// one is configured) and reads their manifests under a deadline.
type Loader struct {
	limits    Limits
	tenantLim func(module string) Limits
	tenancy   Tenancy
	cache     wazero.CompilationCache
	cacheDir  string    // LoaderOptions.CacheDir: "" for a cache in memory
	dir       *cacheDir // bounds the cache's directory; nil: unbounded or in memory
	funcs     []extism.HostFunction
	poolSize  int
	reaper    *reaper
	log       *slog.Logger
	// compiling counts compilations running, abandoned ones included;
	// closed, under mu, refuses new ones once Close began waiting for
	// them (a module whose code was released compiles after load).
	compiling sync.WaitGroup
	mu        sync.Mutex
	closed    bool
	// compiles counts the compilations started (tests: a module refused
	// before compiling starts none).
	compiles atomic.Int64
	// shared is the compiled code modules with the same bytes share, by
	// shareKey (sharedcode.go).
	shareMu sync.Mutex
	shared  map[string]*sharedCode
	// refuseLinks, refuseWritable: LoaderOptions.RefuseLinks and
	// RefuseWritable.
	refuseLinks, refuseWritable bool
	// sched shares the guest slots between tenants (fairshare.go); nil
	// when GuestConcurrency < 0.
	sched *Scheduler
	// compileLater: LoaderOptions.CompileLater.
	compileLater bool
	// warmSlots bounds the background compiles of modules loaded with
	// their code not compiled (warm.go); warmups counts those goroutines
	// and the one packing sources (background), and stop, closed by
	// Close, drops those still waiting for a slot and the packing left.
	warmSlots chan struct{}
	warmups   sync.WaitGroup
	stop      chan struct{}
}

// LoaderOptions configure a Loader.
type LoaderOptions struct {
	// Limits apply to every module unless TenantLimits says otherwise.
	Limits Limits
	// TenantLimits, when set, returns the limits for a module by name
	// (a tenant's overrides over Limits).
	TenantLimits func(module string) Limits
	// Tenancy says which tenant each module belongs to and what tenants
	// grant each other; the zero value puts every module in DefaultTenant.
	Tenancy Tenancy
	// CacheDir, when set, keeps compiled code on disk across restarts.
	CacheDir string
	// CacheMaxBytes bounds CacheDir: after a compile that wrote to it,
	// the least recently used modules that are not loaded are deleted
	// until it fits (see cacheDir). 0 leaves it unbounded.
	CacheMaxBytes int64
	// HostFunctions are the functions modules may import.
	HostFunctions []extism.HostFunction
	// Instances caps the instances of one module alive at once (calls
	// beyond it wait); 0 means GOMAXPROCS.
	Instances int
	// Clock is what idle instances are timed and reaped by (see
	// Limits.InstanceIdle; nil: clock.System).
	Clock clock.Clock
	// RefuseLinks refuses every symbolic link in the plugins directory
	// ([plugins] follow_links = false). By default a link that resolves
	// within the directory is followed (a Kubernetes ConfigMap or Secret
	// volume is made of such links, and so is a deploy that swaps
	// orders.wasm -> releases/42/orders.wasm); a link out of it is always
	// refused (ErrLinkOut).
	RefuseLinks bool
	// RefuseWritable refuses a plugins directory, or a module file, that
	// users other than its owner and group may write ([plugins]
	// refuse_writable); by default each load logs it (WARN).
	RefuseWritable bool
	// GuestConcurrency is how many guest calls run at once on the host,
	// shared between tenants by weight (fairshare.go); 0 means
	// DefaultGuestConcurrency, < 0 turns the sharing off (each module's
	// Instances is then the only bound).
	GuestConcurrency int
	// Shares are the tenants' weights, max_concurrency and
	// calls_per_second, by tenant name.
	Shares map[string]ShareOptions
	// CompileLater is a serving host's: a directory load compiles no
	// module that has a manifest memo in CacheDir, and a start reads the
	// manifests of those without one on wazero's interpreter; their code
	// is compiled in the background, or at the first call (memo.go,
	// warm.go). Off (a command that validates, a test), every load
	// compiles. Only with a CacheDir.
	CompileLater bool
	Logger       *slog.Logger
}

// NewLoader returns a Loader. Close it to release the compilation cache.
func NewLoader(opts LoaderOptions) (*Loader, error) {
	l := &Loader{limits: opts.Limits.withDefaults(), tenantLim: opts.TenantLimits, tenancy: opts.Tenancy, funcs: opts.HostFunctions,
		poolSize: opts.Instances, reaper: newReaper(opts.Clock), log: opts.Logger, refuseLinks: opts.RefuseLinks, refuseWritable: opts.RefuseWritable,
		warmSlots: newWarmSlots(), stop: make(chan struct{}), compileLater: opts.CompileLater && opts.CacheDir != "",
		shared: map[string]*sharedCode{}}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if opts.GuestConcurrency >= 0 {
		l.sched = NewScheduler(SchedulerOptions{Slots: opts.GuestConcurrency, Tenants: opts.Shares})
	}
	// Extism drops every guest log line below a process-wide level that
	// is off unless set, so a module's ctx.Log never reached the logger.
	// Let every guest level through (the logger's own level decides), but
	// not trace: extism's own trace lines are printed to stdout at each
	// instantiation, before the instance's logger is set.
	extism.SetLogLevel(extism.LogLevelDebug)
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("plugins.cache_dir %s: %w", opts.CacheDir, err)
		}
		l.cache, l.cacheDir = c, opts.CacheDir
		if opts.CacheMaxBytes > 0 {
			l.dir = newCacheDir(opts.CacheDir, opts.CacheMaxBytes, l.log)
			if err := l.dir.warm(context.Background(), c); err != nil {
				_ = c.Close(context.Background())
				return nil, fmt.Errorf("plugins.cache_dir %s: %w", opts.CacheDir, err)
			}
		}
	} else {
		l.cache = wazero.NewCompilationCache()
	}
	if l.funcs == nil {
		l.funcs = HostFunctions(nil)
	}
	l.funcs = append(slices.Clip(l.funcs), HostFunctionsV2()...)
	return l, nil
}

// Scheduler returns the scheduler that shares the guest slots between the
// tenants of the modules this loader loads (nil if it shares none).
func (l *Loader) Scheduler() *Scheduler { return l.sched }

// Close stops reaping idle instances (the modules still loaded keep
// theirs), drops the warm-ups not started and waits for those compiling
// (warm.go), and releases the compilation cache. A compilation abandoned past its
// deadline (see within) still uses it, and wazero fails hard if the cache
// closes under a compilation: the cache is then closed when the last such
// compilation ends, in the background.
func (l *Loader) Close(ctx context.Context) error {
	l.reaper.close()
	l.mu.Lock()
	if !l.closed {
		close(l.stop)
	}
	l.closed = true
	l.mu.Unlock()
	l.warmups.Wait()
	idle := make(chan struct{})
	go func() {
		l.compiling.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		return l.cache.Close(ctx)
	default:
	}
	go func() {
		<-idle
		_ = l.cache.Close(context.Background())
	}()
	return nil
}

// wasmMagic is the first four bytes of every binary WebAssembly module.
var wasmMagic = []byte{0x00, 'a', 's', 'm'}

// LoadFile loads one module file, compiled (LoadDir, the path of a start
// and a reload, may not: LoaderOptions.CompileLater). Every failure is a *LoadError naming the
// file. Links in path are followed (the caller named it), but only a
// regular file is read, and no more of it than MaxModuleBytes.
func (l *Loader) LoadFile(ctx context.Context, path string) (*Module, error) {
	return l.loadOrReuse(ctx, path, func() (*os.File, fs.FileInfo, error) { return openFile(path) }, nil, loadCompiled)
}

// loadOrReuse loads the module file open opens, or returns old, retained,
// if the file still holds old's bytes: the same file unmodified (by the
// fstat of the opened file), or a file with the same SHA-256; how says
// how a file loaded anew is.
func (l *Loader) loadOrReuse(ctx context.Context, path string, open func() (*os.File, fs.FileInfo, error), old *Module, how loadHow) (*Module, error) {
	file := filepath.Base(path)
	var digest string
	fail := func(err error) (*Module, error) { return nil, &LoadError{File: file, SHA256: digest, Err: err} }
	f, stat, err := open()
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if old != nil && old.stat != nil && os.SameFile(stat, old.stat) && stat.Size() == old.stat.Size() &&
		stat.ModTime().Equal(old.stat.ModTime()) && old.retain() {
		return old, nil
	}
	lim := l.limitsOf(moduleName(file))
	if how != loadCompiled {
		// Hashed first, and served from its memo or section if it has
		// one, without its bytes in memory (loadUnread).
		sum, size, err := hashModule(f, stat, lim.MaxModuleBytes)
		if err != nil {
			return fail(err)
		}
		digest = hex.EncodeToString(sum[:])
		if old != nil && digest == old.SHA256 && old.retain() {
			return old, nil
		}
		if m := l.loadUnread(f, path, size, sum, lim, how); m != nil {
			m.Path, m.stat = path, stat
			return m, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fail(err)
		}
	}
	b, err := readModule(f, stat, lim.MaxModuleBytes)
	if err != nil {
		return fail(err)
	}
	sum := sha256.Sum256(b)
	digest = hex.EncodeToString(sum[:])
	if old != nil && digest == old.SHA256 && old.retain() {
		return old, nil
	}
	m, err := l.load(ctx, file, b, sum, lim, how)
	if err != nil {
		return fail(err)
	}
	m.Path, m.stat = path, stat
	return m, nil
}

// loadUnread loads the module file f (path; size bytes, as hashed: sum)
// without reading its code, as a start or a reload that compiles later
// (how) may: from its manifest memo, or, at a start, from its
// protean.manifest section (read by its sections' headers: a few hundred
// bytes of a Go module's 4 MB). Its first compile reads the file again,
// and refuses it if it changed meanwhile (a *source of the file); so does
// packing it for compiling again (packLater), soon after the load. nil:
// it has neither, or a section that does not read; load reads it whole
// and says why.
func (l *Loader) loadUnread(f *os.File, path string, size int64, sum [sha256.Size]byte, lim Limits, how loadHow) *Module {
	file := filepath.Base(path)
	memoFile := memoName(sum, lim)
	if mm, man := l.memo(memoFile); mm != nil {
		m := l.newModule(file, sum, lim, mm.Deadline, mm.HasStart)
		m.fromMemo = true
		return l.lazy(m, newFileSource(path, sum, lim.MaxModuleBytes, nil), man, *mm, memoFile)
	}
	if how != loadLazy {
		return nil
	}
	raw, ok, err := abi.ManifestAt(f, size)
	if err != nil || !ok {
		return nil
	}
	// Decoded by the rules of protean_manifest's answer (readManifest).
	man, err := abi.DecodeManifest(raw)
	if err != nil {
		return nil
	}
	// A start takes the module at its section's word: nothing is
	// prepared, compiled or run before the set validates and serves.
	m := l.newModule(file, sum, lim, "", false)
	m.fromSection = true
	return l.lazySection(m, newFileSource(path, sum, lim.MaxModuleBytes, raw), man, raw, memoFile)
}

// limitsOf returns the limits of the module named name (its file name
// without .wasm): its tenant's, when there are tenant limits.
func (l *Loader) limitsOf(name string) Limits {
	if l.tenantLim != nil {
		return l.tenantLim(name).withDefaults()
	}
	return l.limits
}

// compile compiles code (prepared, see prepare) under the module's
// compile deadline, on an engine of its own: a compilation cache of its
// own on the loader's directory, or, without one, the runtime's own
// engine (see load); key is the code's key in the bounded cache's index.
// interp compiles it for wazero's interpreter instead, with no cache (a
// start reads a manifest so, see loadInterpreted).
func (l *Loader) compile(ctx context.Context, name string, code []byte, mode string, lim Limits, interp bool) (*compiledCode, string, error) {
	key := codeKey(code, mode)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, key, errLoaderClosed
	}
	l.compiling.Add(1)
	l.mu.Unlock()
	manifest := extism.Manifest{Wasm: []extism.Wasm{extism.WasmData{Data: code, Name: "main"}}}
	c, err := within(ctx, lim.compileDeadline(len(code)), func() (c *compiledCode, err error) {
		defer l.compiling.Done()
		c = &compiledCode{}
		rc := wazero.NewRuntimeConfig()
		if interp {
			rc = wazero.NewRuntimeConfigInterpreter()
		} else if l.cacheDir != "" {
			cache, err := wazero.NewCompilationCacheWithDir(l.cacheDir)
			if err != nil {
				return nil, err
			}
			c.own = cache
			rc = rc.WithCompilationCache(cache)
		}
		// (Without a directory, no cache: the runtime's engine is its own
		// and closes with it.)
		rc = rc.
			WithCloseOnContextDone(mode == DeadlineRuntime).
			WithMemoryLimitPages(uint32(lim.MemoryMB) * 16) // 64 KiB pages
		compile := func() error {
			l.compiles.Add(1)
			c.CompiledPlugin, err = extism.NewCompiledPlugin(context.WithoutCancel(ctx), manifest, extism.PluginConfig{RuntimeConfig: rc, EnableWasi: true}, l.funcs)
			return err
		}
		if l.dir != nil && !interp {
			// Serialized with the other compiles (while it waits, its
			// deadline runs: a compile that overran its own still holds the
			// core).
			_ = l.dir.compile(key, name, compile)
		} else {
			_ = compile()
		}
		if err != nil {
			_ = c.close(context.Background())
			return nil, err
		}
		return c, nil
	}, func(c *compiledCode) { _ = c.close(context.Background()) })
	return c, key, err
}

// codeKey is the key in the bounded cache's index of code (prepared, see
// prepare) compiled in deadline mode mode: wazero's cache key covers the
// code and whether it closes on a context's end, and so does this one.
func codeKey(code []byte, mode string) string {
	sum := sha256.Sum256(code)
	return hex.EncodeToString(sum[:]) + "/" + mode
}

// How a load reads a module's manifest.
type loadHow int

const (
	// loadCompiled compiles the module and asks it (LoadFile).
	loadCompiled loadHow = iota
	// loadMemo takes the manifest memo if at hand (memo.go), compiling
	// nothing, else compiles the module and asks it (a reload: a new
	// version is compiled before it goes live).
	loadMemo
	// loadLazy takes the memo if at hand, else the module's
	// protean.manifest section if it has one, else asks the module on
	// wazero's interpreter; either way its code is compiled later (a
	// start: loadInterpreted).
	loadLazy
)

// load reads b, the bytes of file (at most lim.MaxModuleBytes, with
// their SHA-256 sum), and its manifest, as how says, and writes its
// manifest memo.
func (l *Loader) load(ctx context.Context, file string, b []byte, sum [sha256.Size]byte, lim Limits, how loadHow) (*Module, error) {
	if len(b) == 0 {
		return nil, ErrEmptyFile
	}
	if len(b) < 8 || string(b[:4]) != string(wasmMagic) {
		return nil, fmt.Errorf("%w: bad magic number", ErrNotWASM)
	}
	name := moduleName(file)
	memoFile := memoName(sum, lim)
	// The module's code is compiled without its protean.manifest section
	// (b from here on): embedding the manifest does not change its code's
	// key, so what plugin embed-manifest compiled is what a start finds.
	// (A module that does not parse is abi.ErrNotModule: ErrNotWASM.)
	embeddedRaw, _, b, err := abi.SplitManifest(b)
	if err != nil {
		return nil, err
	}
	var embedded *abi.Manifest
	if embeddedRaw != nil {
		// Decoded by the rules of protean_manifest's answer (readManifest).
		if embedded, err = abi.DecodeManifest(embeddedRaw); err != nil {
			return nil, fmt.Errorf("%s section: %w", abi.ManifestSection, err)
		}
	}
	code, mode, hasStart, err := prepareFile(file, b, lim, l.log)
	if err != nil {
		return nil, err
	}
	// Every module gets an engine of its own: wazero frees compiled code
	// only with its engine, and an engine is shared by every runtime of a
	// compilation cache, so on the loader's one cache a module closed by a
	// reload kept its code (about 24 MB for a Go module) until the loader
	// closed. The disk cache is still shared: a module compiled before is
	// a read of its file. Modules with the same bytes share one compile
	// (sharedcode.go).
	var compiled *compiledCode
	var key string
	if how == loadLazy {
		compiled, key, err = l.compile(ctx, name, code, mode, lim, true)
	} else {
		compiled, key, err = l.compileShared(ctx, name, code, mode, lim)
	}
	if errors.Is(err, ErrCompileTimeout) || errors.Is(err, ErrCanceled) || errors.Is(err, errLoaderClosed) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotWASM, err)
	}
	if how == loadLazy {
		return l.loadInterpreted(ctx, file, b, sum, lim, compiled, key, mode, hasStart, memoFile)
	}
	m := l.newModule(file, sum, lim, mode, hasStart)
	m.pool.compiled = compiled
	man, raw, err := l.readManifest(ctx, m)
	if err == nil && embedded != nil && !reflect.DeepEqual(man, embedded) {
		err = ErrManifestSection
	}
	if err != nil {
		_ = compiled.close(ctx)
		return nil, err
	}
	// A module whose code may be released keeps what compiles it again
	// (codeidle.go); only with a disk cache to compile it from.
	if lim.CodeIdle > 0 && l.cacheDir != "" {
		src := newSource(b)
		src.pack() // (beside a compile, packing is little)
		m.recompile = l.recompiler(name, src, mode, lim, nil)
	}
	m.Manifest, m.manifestJSON = man, raw
	l.remember(memoFile, manifestMemo{Manifest: raw, Deadline: mode, HasStart: hasStart, Key: key})
	l.loaded(m, key)
	return m, nil
}

// loadInterpreted reads the manifest of the module file (bytes b) on
// interp, its code compiled for wazero's interpreter, then closes that:
// a start reads each module's manifest so, without a memo, in a fraction
// of a compile (a Go module: ~0.3 s to compile for the interpreter and
// ~0.1 s for the manifest, against 1.4-3 s to compile), validates the set
// and serves, and compiles the code later (see lazy). key is the code's
// key in the compiled-code cache.
func (l *Loader) loadInterpreted(ctx context.Context, file string, b []byte, sum [sha256.Size]byte, lim Limits,
	interp *compiledCode, key, mode string, hasStart bool, memoFile string) (*Module, error) {
	m := l.newModule(file, sum, lim, mode, hasStart)
	m.pool.compiled = interp
	man, raw, err := l.readManifest(ctx, m)
	m.pool.compiled = nil
	_ = interp.close(ctx)
	if err != nil {
		return nil, err
	}
	mm := manifestMemo{Manifest: raw, Deadline: mode, HasStart: hasStart, Key: key}
	l.remember(memoFile, mm)
	return l.lazy(m, newSource(b), man, mm, memoFile), nil
}

// lazy makes m, with manifest man as mm describes it, a loaded module
// whose code is not compiled yet: as if code_idle_ms had released it, its
// first call compiles it, and so does the warm-up a directory load
// starts for it unless code_idle_ms releases idle code anyway (warm.go).
// Its first compile files the memo (memoFile) under the code's entry in
// the bounded cache, so that pruning the one deletes the other.
func (l *Loader) lazy(m *Module, src *source, man *abi.Manifest, mm manifestMemo, memoFile string) *Module {
	m.source = src // packed later, if at all (see source)
	m.memo = filepath.Join(memoDir, memoFile)
	compile := l.recompiler(m.Name(), m.source, mm.Deadline, m.Limits, nil)
	m.recompile = l.filing(m, func() string { return mm.Key }, compile)
	m.Manifest, m.manifestJSON = man, mm.Manifest
	l.loaded(m, mm.Key)
	return m
}

// filing returns compile, which after its first success files m's memo
// under its code's key (key(), known by then) in the bounded cache, so
// that pruning the code deletes the memo. (A module's compiles run one
// at a time: filed needs no lock.)
func (l *Loader) filing(m *Module, key func() string, compile func(context.Context) (*compiledCode, error)) func(context.Context) (*compiledCode, error) {
	filed := l.dir == nil
	return func(ctx context.Context) (*compiledCode, error) {
		c, err := compile(ctx)
		if err == nil && !filed {
			l.dir.memo(key(), m.memo)
			filed = true
		}
		return c, err
	}
}

// lazySection makes m, whose manifest man (raw, its bytes) a start read
// from its protean.manifest section, a loaded module whose code is not
// even prepared: reading, hashing and splitting its file is all its start
// costs. Preparing its code (bounding its tables, checking its shape,
// instrumenting it: ~30 ms of a core for a Go module, most of a start's
// work before) is part of its first compile, which also finds how its
// deadline is enforced (Module.Deadline, "" until then), writes its memo
// and marks its code's key in the bounded cache. A module over a shape
// limit is refused there: its calls fail with the error, as after a
// failed warm-up (warm.go), until a reload replaces it. (Its section
// passed a compiled load's check when it was embedded, validate and
// plugin test refuse it, and a reload compiles before it goes live; only
// a cold start skips the check.)
func (l *Loader) lazySection(m *Module, src *source, man *abi.Manifest, raw []byte, memoFile string) *Module {
	m.source = src // packed later, if at all (see source)
	m.memo = filepath.Join(memoDir, memoFile)
	var key string
	// The first compile's findings: Deadline and hasStart are set under
	// the pool's lock, and instances, which read them, are made only from
	// code a compile handed to the pool under it.
	first := func(mode string, hasStart bool, k string) {
		key = k
		p := m.pool
		p.mu.Lock()
		m.Deadline, m.hasStart = mode, hasStart
		if !p.closed && l.dir != nil {
			m.uncache = l.dir.acquire(key)
		}
		p.mu.Unlock()
		l.remember(memoFile, manifestMemo{Manifest: raw, Deadline: mode, HasStart: hasStart, Key: key})
	}
	compile := l.recompiler(m.Name(), m.source, "", m.Limits, first)
	m.recompile = l.filing(m, func() string { return key }, compile)
	m.Manifest, m.manifestJSON = man, raw
	m.refs.Store(1)
	l.reaper.add(m)
	return m
}

// prepareFile bounds the tables of a module file's bytes and prepares its
// code for compiling (see prepare).
func prepareFile(file string, b []byte, lim Limits, log *slog.Logger) (code []byte, mode string, hasStart bool, err error) {
	if b, err = boundTables(b, lim.MaxTableElements); err != nil {
		return nil, "", false, err
	}
	return prepare(file, b, lim, log)
}

// newModule is a module of the loader, with no code, manifest or
// holder yet.
func (l *Loader) newModule(file string, sum [sha256.Size]byte, lim Limits, mode string, hasStart bool) *Module {
	m := &Module{File: file, SHA256: hex.EncodeToString(sum[:]), Limits: lim, Deadline: mode,
		pool: newPool(cmp.Or(lim.Instances, l.poolSize), l.reaper.clk.Now), reaper: l.reaper, log: l.log, hasStart: hasStart,
		logs: newLogLimiter(float64(lim.LogsPerSecond), float64(lim.LogBurst))}
	m.Tenant = l.tenancy.of(m.Name())
	m.share = l.sched.Tenant(m.Tenant)
	return m
}

// loaded makes m, with its code's key in the compiled-code cache, a
// loaded module: held once, kept in the bounded cache, reaped when idle.
func (l *Loader) loaded(m *Module, key string) {
	m.refs.Store(1)
	if l.dir != nil {
		m.uncache = l.dir.acquire(key)
	}
	l.reaper.add(m)
}

// Name is the module's file name without .wasm.
func (m *Module) Name() string { return moduleName(m.File) }

// moduleName is the name of the module in file: its name without .wasm.
func moduleName(file string) string { return strings.TrimSuffix(file, filepath.Ext(file)) }

// readManifest calls the module's protean_manifest and returns the
// manifest, decoded, and its bytes.
func (l *Loader) readManifest(parent context.Context, m *Module) (*abi.Manifest, []byte, error) {
	ctx, cancel := context.WithTimeout(parent, m.Limits.ManifestTimeout)
	defer cancel()
	inst, err := m.instance(ctx, m.pool.compiled, l.log)
	switch {
	case err != nil && parent.Err() != nil:
		return nil, nil, fmt.Errorf("%w: instantiating: %v", ErrCanceled, parent.Err())
	case err != nil && (ctx.Err() != nil || errors.Is(err, ErrTimeout)): // a start function that did not return
		return nil, nil, fmt.Errorf("%w (limit %s): %v", ErrManifestTimeout, m.Limits.ManifestTimeout, err)
	case err != nil:
		return nil, nil, err
	}
	defer inst.Close(context.Background())
	if !inst.FunctionExists(abi.ExportManifest) {
		return nil, nil, ErrNoManifest
	}
	// A v2 module may write its manifest with the v2 output function
	// instead of Extism's output_set (abiv2.go).
	callCtx, v2 := manifestCallV2(ctx, inst.Plugin)
	release := inst.guard(ctx, nil)
	rc, out, err := inst.CallWithContext(callCtx, abi.ExportManifest, nil)
	stopped := release()
	if v2 != nil && (v2.out != nil || v2.outErr != nil) && !stopped {
		if v2.outErr != nil {
			return nil, nil, fmt.Errorf("%s: %v", abi.ExportManifest, v2.outErr)
		}
		out = v2.out
	}
	switch {
	case parent.Err() != nil:
		return nil, nil, fmt.Errorf("%w: reading %s: %v", ErrCanceled, abi.ExportManifest, parent.Err())
	case stopped || ctx.Err() != nil:
		return nil, nil, fmt.Errorf("%w (limit %s)", ErrManifestTimeout, m.Limits.ManifestTimeout)
	case err != nil:
		if t := trapOf(err); t != nil {
			return nil, nil, fmt.Errorf("%s: %w", abi.ExportManifest, t)
		}
		return nil, nil, fmt.Errorf("%w (code %d): %v", ErrManifestFailed, rc, err)
	case rc != 0:
		return nil, nil, fmt.Errorf("%w (code %d): %s", ErrManifestFailed, rc, inst.GetError())
	}
	man, err := abi.DecodeManifest(out)
	return man, out, err
}

// instance makes a fresh instance of the module with its logs routed to
// log; an instrumented module's start function runs here, under the call
// deadline (see attach).
func (m *Module) instance(ctx context.Context, c *compiledCode, log *slog.Logger) (*instance, error) {
	// wazero's default clocks are fake (they step on each read); handlers
	// stamp events with time.Now, so give them the real ones.
	// wazero's default random source is a fixed seed, so every instance
	// would draw the same "random" bytes: give guests the host's
	// crypto-quality source.
	mc := wazero.NewModuleConfig().WithSysWalltime().WithSysNanotime().WithRandSource(rand.Reader)
	in := &instance{mem: &memoryMeter{budget: m.Limits.instanceBudget()}}
	if m.Deadline == DeadlineInstrumented {
		mc = mc.WithOsyield(in.yield) // the checks call in here (see yield)
	}
	ictx := ctx
	if m.Deadline == DeadlineRuntime {
		// A start section runs inside instantiation, where only the
		// runtime's own check can stop it (an instrumented module's runs
		// in attach).
		var cancel context.CancelFunc
		ictx, cancel = context.WithTimeout(ctx, m.Limits.Timeout)
		defer cancel()
	}
	// Making an instance is long work (a Go module's: 10-15 ms of a core,
	// most of it wazero evaluating its data and element segments), done
	// for the module's tenant: it takes a turn at the cores, as a long
	// guest call does (cores.go).
	var deadline int64
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl.UnixNano()
	}
	onCore := m.share != nil && m.share.turn(false, time.Now().UnixNano(), deadline)
	inst, err := c.Instance(experimental.WithMemoryAllocator(ictx, in.mem), extism.PluginInstanceConfig{ModuleConfig: mc})
	if onCore {
		m.share.releaseTurn()
	}
	if err != nil {
		return nil, fmt.Errorf("instantiate: %w", err)
	}
	inst.SetLogger(func(level extism.LogLevel, msg string) {
		m.logLine(log, context.Background(), slogLevel(level), msg)
	})
	in.Plugin = inst
	if m.Deadline == DeadlineInstrumented {
		if err := m.attach(ctx, in); err != nil {
			_ = inst.Close(context.Background())
			return nil, err
		}
	}
	return in, nil
}

func slogLevel(l extism.LogLevel) slog.Level {
	switch l {
	case extism.LogLevelTrace, extism.LogLevelDebug:
		return slog.LevelDebug
	case extism.LogLevelWarn:
		return slog.LevelWarn
	case extism.LogLevelError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// LoadDir loads every *.wasm file of dir, in name order. It returns the
// modules that loaded and one error per file that did not; the caller
// decides whether a partial set may run (the host never runs one). Only
// regular files are read (file.go): an entry named *.wasm that is a named
// pipe, a device, a socket, a directory or a link out of dir is refused by
// name, and a dir others may write is logged or refused (RefuseWritable).
func (l *Loader) LoadDir(ctx context.Context, dir string) ([]*Module, []error) {
	return l.loadDir(ctx, dir, nil)
}

// loadDir is LoadDir that carries over, instead of loading again, every
// module of running whose file has the same name and contents (the same
// SHA-256): a reload of one changed module compiles and instantiates that
// one only. A carried module is retained; closing it drops that hold.
func (l *Loader) loadDir(ctx context.Context, dir string, running *Set) ([]*Module, []error) {
	if err := l.checkDir(dir); err != nil {
		return nil, []error{err}
	}
	d, err := openPluginDir(dir)
	if err != nil {
		return nil, []error{fmt.Errorf("plugins directory %s: %w", dir, err)}
	}
	defer d.Close()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, []error{fmt.Errorf("plugins directory %s: %w", dir, err)}
	}
	var names []string
	for _, e := range entries {
		// Every entry named *.wasm, a directory too: what is not a
		// regular file is refused by name, not passed over in silence.
		if strings.HasSuffix(e.Name(), ".wasm") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, []error{fmt.Errorf("plugins directory %s: no *.wasm files", dir)}
	}
	reuse := map[string]*Module{}
	if running != nil {
		for _, m := range running.Modules() {
			reuse[m.File] = m
		}
	}
	// A serving host's start serves before it compiles; its reload
	// compiles a new version before it goes live (the running set serves
	// meanwhile).
	how := loadCompiled
	switch {
	case l.compileLater && running == nil:
		how = loadLazy
	case l.compileLater:
		how = loadMemo
	}
	if running == nil {
		l.log.Info("loading plugins", "dir", dir, "files", len(names))
	}
	// The files load on up to GOMAXPROCS goroutines: reading, hashing and
	// preparing a module, and its manifest call, take a core each (its
	// compile too, unless the bounded cache serializes compiles). The
	// result keeps name order.
	loaded := make([]*Module, len(names))
	failed := make([]error, len(names))
	var done atomic.Int32
	var wg sync.WaitGroup
	slots := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, n := range names {
		slots <- struct{}{}
		if ctx.Err() != nil { // a shutdown: the files left are not opened
			<-slots
			failed[i] = fmt.Errorf("plugins directory %s: loading stopped before %s: %w", dir, n, ctx.Err())
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			open := func() (*os.File, fs.FileInfo, error) { return l.open(d, n) }
			began := time.Now()
			m, err := l.loadOrReuse(ctx, filepath.Join(dir, n), open, reuse[n], how)
			loaded[i], failed[i] = m, err
			if of := done.Add(1); err == nil && m != reuse[n] {
				// A start says how far it is: a cold compile of a Go module
				// takes seconds, and nothing else is logged meanwhile.
				l.log.Info("module loaded", "file", n, "of", fmt.Sprintf("%d/%d", of, len(names)),
					"took", time.Since(began).Round(time.Millisecond), "version", m.Manifest.Module.Version, "sha256", m.SHA256[:12],
					"memo", m.fromMemo, "section", m.fromSection, "compiled", m.memo == "")
			}
		})
	}
	wg.Wait()
	var mods []*Module
	var errs []error
	var pack []*source
	for i, n := range names {
		switch m := loaded[i]; {
		case failed[i] != nil:
			errs = append(errs, failed[i])
		case m == nil:
		default:
			mods = append(mods, m)
			// Compiled once every file is read: a start's manifests first.
			// Code that is released when idle needs its source packed;
			// code that is kept drops it after this first compile.
			switch {
			case m == reuse[n]: // carried as it runs
			case m.memo != "" && m.Limits.CodeIdle <= 0:
				m.source = nil // its compile holds it, and drops it after (loadCode)
				l.warm(m)
			case m.source != nil:
				pack = append(pack, m.source)
			}
		}
	}
	l.packLater(pack)
	return mods, errs
}
