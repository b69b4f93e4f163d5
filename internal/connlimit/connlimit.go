// Package connlimit bounds the connections an HTTP server holds open, and
// keeps serving new clients when idle ones fill the bound.
//
// golang.org/x/net/netutil.LimitListener only blocks Accept at the bound:
// a client that opens max connections and leaves them idle (keep-alive,
// or connected and silent) shuts every other client out until they time
// out. [Listener] instead closes the oldest idle connection to make room
// for a new one, and blocks only when every open connection is busy with
// a request. It learns which connections are idle from
// http.Server.ConnState ([Listener.ConnState]).
//
// Idle here is http.StateNew (accepted, no complete request header yet;
// a silent or slow-header client looks like this) and http.StateIdle
// (between keep-alive requests). Closing one races with a request the
// client may be sending at that moment; that client sees the connection
// closed, as it would at the server's idle timeout.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"sync"
)

// Listener is a net.Listener that holds at most max connections open (one
// more while a new connection waits for room).
type Listener struct {
	net.Listener
	max int

	mu      sync.Mutex
	open    map[*conn]struct{}
	idle    list.List // of *conn, idle ones, oldest first
	evicted int64
	changed chan struct{} // signaled when a connection closes or goes idle
	closed  chan struct{}
	once    sync.Once
}

// New returns a Listener over ln holding at most max connections; max
// must be > 0. Set the http.Server's ConnState to l.ConnState.
func New(ln net.Listener, max int) *Listener {
	return &Listener{Listener: ln, max: max, open: map[*conn]struct{}{},
		changed: make(chan struct{}, 1), closed: make(chan struct{})}
}

// Accept accepts a connection; when max are open, it closes the oldest
// idle one to make room, or waits until one closes or goes idle.
func (l *Listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, l: l}
	for {
		l.mu.Lock()
		if len(l.open) < l.max {
			l.open[c] = struct{}{}
			c.idle = l.idle.PushBack(c) // new: idle until its request arrives
			l.mu.Unlock()
			return c, nil
		}
		var oldest *conn
		if front := l.idle.Front(); front != nil {
			oldest = front.Value.(*conn)
			l.evicted++
		}
		l.mu.Unlock()
		if oldest != nil {
			_ = oldest.Close() // removes it from open and idle
			continue
		}
		select {
		case <-l.changed:
		case <-l.closed:
			_ = nc.Close()
			return nil, net.ErrClosed
		}
	}
}

// Close closes the listener; an Accept waiting for room returns.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// ConnState is the http.Server's ConnState hook: it tracks which
// connections are idle.
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	switch s {
	case http.StateIdle:
		l.mu.Lock()
		if _, open := l.open[c]; open {
			l.removeIdle(c)
			c.idle = l.idle.PushBack(c)
		}
		l.mu.Unlock()
		l.signal()
	case http.StateActive, http.StateHijacked:
		l.mu.Lock()
		l.removeIdle(c)
		l.mu.Unlock()
	case http.StateClosed:
		_ = c.Close()
	}
}

// Open is how many connections are open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open)
}

// Idle is how many open connections are idle.
func (l *Listener) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Evicted counts the idle connections closed to make room.
func (l *Listener) Evicted() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.evicted
}

func (l *Listener) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// removeIdle takes c off the idle list; l.mu is held.
func (l *Listener) removeIdle(c *conn) {
	if c.idle != nil {
		l.idle.Remove(c.idle)
		c.idle = nil
	}
}

// conn leaves its Listener's count when it closes, once.
type conn struct {
	net.Conn
	l    *Listener
	idle *list.Element // in l.idle while idle; guarded by l.mu
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.open, c)
		c.l.removeIdle(c)
		c.l.mu.Unlock()
		c.l.signal()
	})
	return err
}
