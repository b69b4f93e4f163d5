package host

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
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
// What the module keeps to compile again is the code it compiled (after
// boundTables and prepare, so the compile is a cache hit and nothing is
// instrumented again), compressed with compress/flate (BestSpeed; zstd is
// not a dependency): the Go client_orders example's 4.19 MB pack into
// 1.35 MB (BenchmarkCodeIdle, packed_MB), against the ~24 MB released;
// an idle module keeps ~1.9 MB in all. Reading the file again would keep
// nothing, but a file changed or removed since the load (a deploy
// without watch) would leave the module with no code to run.

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
}

func (c *compiledCode) close(ctx context.Context) error {
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

// recompiler returns what compiles code again for the module name: the
// code is kept compressed.
func (l *Loader) recompiler(name string, code []byte, mode string, lim Limits) (func(context.Context) (*compiledCode, error), error) {
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(code); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	packed := bytes.Clone(buf.Bytes())
	return func(ctx context.Context) (*compiledCode, error) {
		code, err := io.ReadAll(flate.NewReader(bytes.NewReader(packed)))
		if err != nil {
			return nil, fmt.Errorf("unpacking the code: %w", err)
		}
		c, _, err := l.compile(ctx, name, code, mode, lim)
		return c, err
	}, nil
}

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
		ld := p.loading
		if ld == nil {
			ld = &codeLoad{done: make(chan struct{})}
			p.loading = ld
			go m.loadCode(ld)
		}
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
			return nil, fmt.Errorf("%w: compiling released code (limit %s; the compile goes on for the next call)", ErrTimeout, m.Limits.Timeout)
		}
	}
}

// loadCode compiles the module's released code and hands it to the pool,
// or closes it if the module closed meanwhile.
func (m *Module) loadCode(ld *codeLoad) {
	c, err := m.recompile(context.Background())
	p := m.pool
	p.mu.Lock()
	p.loading, ld.err = nil, err
	closed := err == nil && p.closed
	if err == nil && !closed {
		p.compiled = c
		p.codeLoads.Add(1)
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
	if m.recompile == nil || m.Limits.CodeIdle <= 0 {
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
