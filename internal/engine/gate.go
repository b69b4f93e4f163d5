package engine

import "sync"

// gate admits work until it is closed, and lets the closer wait for the
// admitted work to leave. Unlike a WaitGroup it is safe to enter while
// another goroutine waits.
type gate struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n == 0
}

func newGate() *gate { return &gate{idle: make(chan struct{})} }

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.closed && g.n == 0 {
		close(g.idle)
	}
}

// close stops admitting work and returns a channel closed once the work
// already admitted has left. Closing twice returns the same channel.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		if g.n == 0 {
			close(g.idle)
		}
	}
	return g.idle
}
