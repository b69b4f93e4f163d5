package host

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// Warming up modules loaded with their code not compiled: from their
// manifest memo (memo.go), or at a start, their manifest read on wazero's
// interpreter (loadInterpreted).
//
// When code_idle_ms does not release idle code, the loader compiles such a
// module's code in the background once the directory is loaded, at most
// GOMAXPROCS such compiles at a time (the bounded cache serializes
// compiles anyway, cachedir.go), so that the first calls after a start do
// not each wait for a compile. A call that comes first starts the compile
// itself, or waits for the one running (code): the warm-up never delays a
// call. Until its warm-up is done a module is Warming, and the host's
// health reads "starting".
//
// A compile that fails here (past compile_timeout_ms, say: the shape
// limits let it through, and the interpreter took it) is logged as an
// error, the module's calls fail until a reload replaces it, and its memo
// is deleted, so that the next start compiles it before it serves and
// refuses it as a load error.

// warm compiles m's code in the background (see above). Closing the
// loader drops the warm-ups still waiting for a slot, and waits for those
// compiling (each ends within its compile deadline).
func (l *Loader) warm(m *Module) {
	m.warming.Store(true)
	started := l.background(func() {
		defer m.warming.Store(false)
		select {
		case l.warmSlots <- struct{}{}:
		case <-l.stop:
			return
		}
		defer func() { <-l.warmSlots }()
		p := m.pool
		p.mu.Lock()
		if p.closed || p.compiled != nil || m.recompile == nil {
			p.mu.Unlock()
			return
		}
		ld := m.startLoad()
		p.mu.Unlock()
		<-ld.done
		if ld.err != nil && !errors.Is(ld.err, errLoaderClosed) {
			l.log.Error("compiling a module failed after its load: its calls fail until a reload replaces it",
				"module", m.File, "err", ld.err)
			if err := os.Remove(filepath.Join(l.cacheDir, m.memo)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				l.log.Warn("manifest memo not deleted", "memo", m.memo, "err", err)
			}
		}
	})
	if !started {
		m.warming.Store(false)
	}
}

// packLater packs srcs (see source) one after another on a goroutine
// the loader owns, off the path of the load that made them: a warm start
// serves its set without waiting for them. A source that is a file is
// read again here: one that changed since its load is logged (its module
// cannot compile until a reload loads it again). Closing the loader stops
// it.
func (l *Loader) packLater(srcs []*source) {
	if len(srcs) == 0 {
		return
	}
	l.background(func() {
		for _, s := range srcs {
			select {
			case <-l.stop:
				return
			default:
			}
			if err := s.pack(); err != nil {
				l.log.Warn("a module's file is not kept to compile it again: its calls fail once it needs compiling, until a reload loads it again",
					"err", err)
			}
		}
	})
}

// background runs f on a goroutine the loader owns, which Close waits
// for (f ends soon after l.stop closes), unless the loader is closed;
// it reports whether it did.
func (l *Loader) background(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.warmups.Add(1)
	go func() {
		defer l.warmups.Done()
		f()
	}()
	return true
}

// newWarmSlots bounds the warm-ups that compile at once.
func newWarmSlots() chan struct{} { return make(chan struct{}, runtime.GOMAXPROCS(0)) }

// Warming reports whether the module's code is still being compiled after
// a load from its manifest memo, before any call needed it.
func (m *Module) Warming() bool { return m.warming.Load() }

// Warming counts the modules of the set whose code is being compiled
// after a load from their manifest memo: the host is "starting" until it
// is 0.
func (s *Set) Warming() int {
	n := 0
	for _, m := range s.modules {
		if m.Warming() {
			n++
		}
	}
	return n
}
