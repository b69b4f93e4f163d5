package faultproxy

import (
	"net"
	"sync"
)

// Direction is one way through a [Proxy].
type Direction int

const (
	// Upstream is from the client (a host) to the server.
	Upstream Direction = iota
	// Downstream is from the server back to the client.
	Downstream
)

func (d Direction) String() string {
	if d == Upstream {
		return "up"
	}
	return "down"
}

// Proxy forwards TCP connections from a loopback listener to one target,
// and can break them the ways a network does: [Proxy.Cut] resets every
// open connection and refuses new ones, [Proxy.Stall] stops the bytes of
// one direction (the connection stays open, the other way keeps flowing,
// the sender's writes back up once the kernel buffers fill), and
// [Proxy.Resume] ends both.
//
// A stall holds bytes; it never drops or reorders them: what was sent
// during a stall arrives, in order, after the resume, unless the
// connection is cut or closed first.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	conns   map[*link]struct{}
	cut     bool
	gates   [2]chan struct{} // per Direction: non-nil while stalled, closed on resume
	closed  bool
	refused int
	handoff sync.WaitGroup
}

// link is one proxied connection: the client's side and the server's.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		// Linger 0: a cut is a reset, as a dropped route looks to the
		// peer once its next write fails, not a polite FIN.
		for _, c := range []net.Conn{l.client, l.server} {
			if t, ok := c.(*net.TCPConn); ok {
				_ = t.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, conns: map[*link]struct{}{}}
	p.handoff.Add(1)
	go p.accept()
	return p, nil
}

// Refused is how many connections the proxy refused (closed at once)
// while cut or closed.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

func (p *Proxy) accept() {
	defer p.handoff.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		if refuse {
			p.refused++
		}
		p.mu.Unlock()
		if refuse {
			if t, ok := c.(*net.TCPConn); ok {
				_ = t.SetLinger(0)
			}
			_ = c.Close()
			continue
		}
		p.handoff.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.handoff.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.cut || p.closed {
		p.refused++
		p.mu.Unlock()
		l.close()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(l, Upstream, server, client) }()
	go func() { defer wg.Done(); p.pump(l, Downstream, client, server) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// pump copies src to dst, waiting at the gate of dir before each write.
// When either side ends, the whole link is closed: the peers see what a
// real connection's end looks like.
func (p *Proxy) pump(l *link, dir Direction, dst, src net.Conn) {
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass(l, dir) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: either way the link is over
		}
	}
}

// pass blocks while dir is stalled; false when the link was closed
// meanwhile (cut, or the other direction ended).
func (p *Proxy) pass(l *link, dir Direction) bool {
	for {
		p.mu.Lock()
		gate := p.gates[dir]
		_, open := p.conns[l]
		p.mu.Unlock()
		if !open {
			return false
		}
		if gate == nil {
			return true
		}
		<-gate
	}
}

// Cut resets every open connection and refuses new ones until Resume.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	ls := p.takeLinks()
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
}

// takeLinks removes every link from the table (so that stalled pumps see
// them gone) and returns them. Callers hold mu.
func (p *Proxy) takeLinks() []*link {
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
		delete(p.conns, l)
	}
	// Wake the pumps parked at a gate, so they notice.
	for d, g := range p.gates {
		if g != nil {
			close(g)
			p.gates[d] = make(chan struct{})
		}
	}
	return ls
}

// Stall holds every byte going in dir, on open and new connections, until
// Resume.
func (p *Proxy) Stall(dir Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gates[dir] == nil {
		p.gates[dir] = make(chan struct{})
	}
}

// Resume ends a cut and every stall: held bytes flow again, new
// connections are accepted.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for d, g := range p.gates {
		if g != nil {
			close(g)
			p.gates[d] = nil
		}
	}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ls := p.takeLinks()
	for d, g := range p.gates {
		if g != nil {
			close(g)
			p.gates[d] = nil
		}
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range ls {
		l.close()
	}
	p.handoff.Wait()
	return err
}
