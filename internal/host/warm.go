package host

import "runtime"

// Warming up modules loaded from their manifest memo (memo.go).
//
// A module loaded from its memo has no compiled code. When code_idle_ms
// does not release idle code, the loader compiles it at once, in the
// background, at most GOMAXPROCS such compiles at a time (the bounded
// cache serializes compiles anyway, cachedir.go), so that the first calls
// after a warm start do not each wait for a compile. A call that comes
// first starts the compile itself, or waits for the one running (code):
// the warm-up never delays a call. Until its warm-up is done a module is
// Warming, and the host's health reads "starting".

// warm compiles m's code in the background (see above).
func (l *Loader) warm(m *Module) {
	m.warming.Store(true)
	go func() {
		defer m.warming.Store(false)
		l.warmSlots <- struct{}{}
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
	}()
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
