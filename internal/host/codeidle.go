package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/klauspost/compress/zstd"
	"github.com/tetratelabs/wazero"

	"github.com/proteanhq/protean-host/abi"
)

// Releasing a module's compiled code (Limits.CodeIdle).
//
// A loaded Go module holds about 24 MB of compiled code with no instance
// (issue 21: 200 idle modules in 2 GiB). Once the reaper has closed its
// instances and no call came for CodeIdle, the code is closed; the next
// call compiles it again, from the compiled-code cache on disk (a hit:
// ~0.3 s for a Go module), under the module's compile deadline.
//
// wazero frees compiled code only when its engine closes (closing a
// runtime, or an Extism CompiledPlugin, leaves the code in the engine),
// and every runtime of one compilation cache shares its engine. So every
// module compiles with a cache of its own on the loader's directory
// (compiledCode.own), closed with the code (Loader.compile).
//
// What the module keeps to compile again is its file's bytes, compressed
// with zstd (packer; source): the Go client_orders example's 4.19 MB pack
// into about a third (BenchmarkCodeIdle, packed_MB), against the ~24 MB
// released. A directory load packs them after the set is loaded, on one
// goroutine, so that a start does not wait for it. Each compile prepares
// them again (prepareFile), so the compile is a cache hit. Reading the
// file again at each compile would keep nothing, but a file changed or
// removed since the load (a deploy without watch) would leave the module
// with no code to run; so the file is read again only once, soon after
// its load, when the load served it without reading it whole (from its
// manifest section or memo: loadUnread): its first compile, or packing
// it, reads it and checks it still holds the bytes the load hashed
// (ErrModuleChanged). A module a serving host loads without compiling it
// (from its manifest memo or section, or with its manifest read on the
// interpreter: memo.go) starts in the released state.

// errLoaderClosed: a module's released code cannot be compiled again
// once its loader closed (its cache may be closed).
var errLoaderClosed = errors.New("loader closed")

// errModuleClosed: a call began after its module closed.
var errModuleClosed = errors.New("module closed")

// compiledCode is a module's compiled code, and own, the compilation
// cache it alone uses (nil: the loader's), closed with it so that the
// engine gives back the code.
type compiledCode struct {
	*extism.CompiledPlugin
	own wazero.CompilationCache
	// release, for a module's hold on code other modules share
	// (sharedcode.go), ends that hold instead of closing the code.
	release func()
}

func (c *compiledCode) close(ctx context.Context) error {
	if c.release != nil {
		c.release()
		return nil
	}
	var err error
	if c.CompiledPlugin != nil {
		err = c.CompiledPlugin.Close(ctx)
	}
	if c.own != nil {
		err = errors.Join(err, c.own.Close(ctx))
	}
	return err
}

// codeLoad is one compile of a module's released code, which every call
// that needs the code meanwhile waits for.
type codeLoad struct {
	done chan struct{}
	err  error // set before done closes
}

// recompiler returns what compiles the module name again from src, its
// file's bytes: each compile prepares them as the load did (prepareFile:
// deterministic, ~35 ms for a Go module) and must find the deadline
// enforced as mode says. With mode "" (a module a start loaded from its
// protean.manifest section, never prepared: lazySection) the first
// compile finds it and hands it, the start section and the code's key to
// first before it compiles; the compiles after it must find the same. (A
// module's compiles run one at a time: mode needs no lock.)
func (l *Loader) recompiler(name string, src *source, mode string, lim Limits,
	first func(mode string, hasStart bool, key string)) func(context.Context) (*compiledCode, error) {
	return func(ctx context.Context) (*compiledCode, error) {
		b, err := src.bytes()
		if err != nil {
			return nil, err
		}
		code, got, hasStart, err := prepareFile(name+".wasm", b, lim, l.log)
		if err != nil {
			return nil, err
		}
		if mode == "" {
			mode = got
			first(got, hasStart, codeKey(code, got))
		}
		if got != mode {
			return nil, fmt.Errorf("the module's deadline is now enforced %q, not %q as at its load: reload it", got, mode)
		}
		c, _, err := l.compileShared(ctx, name, code, mode, lim)
		return c, err
	}
}

// source is what a module keeps of its file to compile it again: the
// bytes as read, until pack compresses them, or, for a module a load
// served without reading its file whole (from its manifest section or
// memo: loadUnread), the file itself, read again (and checked to hold the
// same bytes) by its first compile, and by pack. Packing a Go module takes
// ~10-20 ms of a core, half of a warm start's work, so a directory load
// leaves it to after the set is loaded (Loader.packLater); a module whose
// code is never released (code_idle_ms off) is compiled once, right
// after, and drops its source then, so it is not packed at all.
type source struct {
	mu     sync.Mutex
	raw    []byte // nil once packed
	packed []byte
	size   int
	file   *moduleFile // read while raw and packed are nil
}

func newSource(b []byte) *source { return &source{raw: b, size: len(b)} }

// newFileSource is the source of a module whose file a load hashed
// (sum) without keeping it; section is the protean.manifest section the
// load served (nil: a manifest from a memo, the file's SHA-256 its key).
func newFileSource(path string, sum [sha256.Size]byte, max int, section []byte) *source {
	return &source{file: &moduleFile{path: path, sum: sum, max: max, section: section}}
}

// ErrModuleChanged: a module's code was needed (its first compile, or its
// file kept for compiling again) after its file changed since the load
// that served its manifest without keeping its bytes. Its calls fail
// until a reload loads the file as it is now.
var ErrModuleChanged = errors.New("module file changed since its load")

// moduleFile is a module file a load hashed without keeping its bytes.
type moduleFile struct {
	path    string
	sum     [sha256.Size]byte
	max     int
	section []byte
}

// read reads the file again and returns its bytes without their
// protean.manifest section, if they are still the bytes it was loaded
// with (its SHA-256; and its section, read apart from the hash).
func (f *moduleFile) read() ([]byte, error) {
	fh, st, err := openFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("reading %s again: %w", f.path, err)
	}
	defer fh.Close()
	b, err := readModule(fh, st, f.max)
	if err != nil {
		return nil, fmt.Errorf("reading %s again: %w", f.path, err)
	}
	changed := sha256.Sum256(b) != f.sum
	section, ok, without, err := abi.SplitManifest(b)
	switch {
	case changed:
	case err != nil:
		return nil, err // the bytes it was loaded with
	case f.section != nil && (!ok || !bytes.Equal(section, f.section)):
		changed = true // its section was read apart from its hash, while it changed
	}
	if changed {
		return nil, fmt.Errorf("%w: %s (sha256 %x at its load); a reload loads it as it is now", ErrModuleChanged, f.path, f.sum[:6])
	}
	return without, nil
}

// pack compresses the bytes, if that was not done yet: a file's, read
// again first.
func (s *source) pack() error {
	s.mu.Lock()
	raw, packed, file := s.raw, s.packed, s.file
	s.mu.Unlock()
	if packed != nil {
		return nil
	}
	if raw == nil {
		var err error
		if raw, err = file.read(); err != nil {
			return err
		}
	}
	packed = slices.Clip(packer().EncodeAll(raw, make([]byte, 0, len(raw)/3)))
	s.mu.Lock()
	s.raw, s.packed, s.size = nil, packed, len(raw)
	s.mu.Unlock()
	return nil
}

// bytes returns the module's bytes without their protean.manifest
// section (not to be modified).
func (s *source) bytes() ([]byte, error) {
	s.mu.Lock()
	raw, packed, file := s.raw, s.packed, s.file
	s.mu.Unlock()
	switch {
	case raw != nil:
		return raw, nil
	case packed == nil:
		return file.read()
	}
	b, err := unpacker().DecodeAll(packed, make([]byte, 0, s.size))
	if err != nil {
		return nil, fmt.Errorf("unpacking the module: %w", err)
	}
	return b, nil
}

// packer and unpacker are the zstd encoder and decoder of the code
// modules keep to compile again (both safe for concurrent EncodeAll and
// DecodeAll). zstd's fastest level packs a Go module's 4.2 MB into about
// a third in ~10 ms, where compress/flate's fastest took ~50 ms (on the
// start path of a warm start, for each module).
var (
	packer = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			panic(err) // only for bad options
		}
		return e
	})
	unpacker = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			panic(err) // only for bad options
		}
		return d
	})
)

// code returns the module's compiled code for an instance about to be
// made, counted live under the pool lock: the reaper releases code only
// when no instance is live, so the code returned stays open. Released
// code is compiled again once (the calls that need it meanwhile wait for
// that compile), within callCtx: a call whose deadline ends first fails,
// and the compile goes on for the next call. ctx is the caller's own, to
// tell a cancellation from the deadline.
func (m *Module) code(callCtx, ctx context.Context) (*compiledCode, error) {
	p := m.pool
	for {
		p.mu.Lock()
		if p.compiled != nil {
			p.live++
			c := p.compiled
			p.mu.Unlock()
			return c, nil
		}
		if p.closed || m.recompile == nil {
			p.mu.Unlock()
			return nil, errModuleClosed
		}
		ld := m.startLoad()
		p.mu.Unlock()
		select {
		case <-ld.done:
			if ld.err != nil {
				return nil, fmt.Errorf("compiling released code: %w", ld.err)
			}
		case <-callCtx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: compiling released code: %v", ErrCanceled, ctx.Err())
			}
			return nil, fmt.Errorf("%w (%w, limit %s; the compile goes on for the next call)", ErrNotReady, ErrTimeout, m.Limits.Timeout)
		}
	}
}

// startLoad returns the compile of the module's code that runs, or
// starts one. The caller holds the pool lock, and has seen no code and a
// recompile.
func (m *Module) startLoad() *codeLoad {
	p := m.pool
	if p.loading == nil {
		p.loading = &codeLoad{done: make(chan struct{})}
		go m.loadCode(p.loading, m.recompile)
	}
	return p.loading
}

// loadCode compiles the module's code with recompile and hands it to the
// pool, or closes it if the module closed meanwhile. Code that is never
// released drops what compiles it (see Loader.lazy).
func (m *Module) loadCode(ld *codeLoad, recompile func(context.Context) (*compiledCode, error)) {
	c, err := recompile(context.Background())
	p := m.pool
	p.mu.Lock()
	p.loading, ld.err = nil, err
	closed := err == nil && p.closed
	if err == nil && !closed {
		p.compiled = c
		p.codeLoads.Add(1)
		if m.Limits.CodeIdle <= 0 {
			m.recompile = nil
		}
	}
	p.mu.Unlock()
	close(ld.done)
	if closed {
		_ = c.close(context.Background())
	}
	if err != nil {
		m.log.Warn("compiling released code failed", "module", m.File, "err", err)
	}
}

// releaseCode closes the module's compiled code if it may be compiled
// again, no instance is live (nor being made) and no call took an
// instance for CodeIdle before now. It reports whether it did.
func (m *Module) releaseCode(now time.Time) bool {
	if m.Limits.CodeIdle <= 0 || m.recompile == nil { // in this order: see loadCode
		return false
	}
	p := m.pool
	p.mu.Lock()
	if p.closed || p.compiled == nil || p.live > 0 || now.Sub(p.used) < m.Limits.CodeIdle {
		p.mu.Unlock()
		return false
	}
	c := p.compiled
	p.compiled = nil
	p.reaping.Add(1)
	p.mu.Unlock()
	defer p.reaping.Done()
	_ = c.close(context.Background())
	p.codeReleased.Add(1)
	return true
}
