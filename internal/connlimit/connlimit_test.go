package connlimit_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/connlimit"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// serve runs an HTTP server behind a Listener of max connections; GET
// /block waits on release.
func serve(t *testing.T, max int, release chan struct{}) (*connlimit.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := connlimit.New(ln, max)
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/block", func(w http.ResponseWriter, _ *http.Request) { <-release })
	srv := &http.Server{Handler: mux, ConnState: l.ConnState}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l, ln.Addr().String()
}

// client is one keep-alive connection, spoken to by hand so the test
// knows which connection is which.
type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &client{Conn: c, r: bufio.NewReader(c)}
}

func (c *client) send(t *testing.T, path string) {
	t.Helper()
	_, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	require.NoError(t, err)
}

func (c *client) get(t *testing.T, path string) error {
	t.Helper()
	c.send(t, path)
	return c.read()
}

func (c *client) read() error {
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// At the bound, a new connection is served and the oldest idle one is
// closed; the younger idle one stays open.
func TestNewConnectionClosesTheOldestIdle(t *testing.T) {
	t.Parallel()
	l, addr := serve(t, 2, nil)
	first, second := dial(t, addr), dial(t, addr)
	require.NoError(t, first.get(t, "/ok"))
	require.NoError(t, second.get(t, "/ok"))
	waitIdle(t, l, 2)
	require.NoError(t, first.get(t, "/ok"))
	waitIdle(t, l, 2) // first is now the younger idle one

	third := dial(t, addr)
	require.NoError(t, third.get(t, "/ok"), "a new client is served at the bound")
	require.Equal(t, int64(1), l.Evicted())
	_, err := second.r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the oldest idle connection was closed")
	require.NoError(t, first.get(t, "/ok"), "the younger idle one is still open")
	require.Equal(t, 2, l.Open())
}

func waitIdle(t *testing.T, l *connlimit.Listener, n int) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d idle connections", n), func() (bool, string) {
		return l.Idle() == n, fmt.Sprintf("%d idle of %d open", l.Idle(), l.Open())
	})
}

// When every open connection is busy, a new one waits for room instead of
// closing a request in progress; it is served once one ends.
func TestBusyConnectionsAreNotClosed(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	l, addr := serve(t, 1, release)
	busy := dial(t, addr)
	busy.send(t, "/block")
	testwait.For(t, "the busy request in progress", func() (bool, string) {
		return l.Open() == 1 && l.Idle() == 0, fmt.Sprintf("%d idle of %d open", l.Idle(), l.Open())
	})
	next := dial(t, addr)
	next.send(t, "/ok")
	done := make(chan error, 1)
	go func() { done <- next.read() }()
	select {
	case err := <-done:
		t.Fatalf("served past the bound while the only connection was busy: %v", err)
	default:
	}
	close(release)
	require.NoError(t, busy.read(), "the busy request finished")
	require.NoError(t, testwait.Recv(t, "the waiting client served", done))
	require.Equal(t, int64(1), l.Evicted(), "the busy one, idle once its request ended, made room")
}

// Closing the listener ends an Accept that waits for room.
func TestCloseEndsAWaitingAccept(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := connlimit.New(ln, 1)
	c1, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c1.Close()
	held, err := l.Accept()
	require.NoError(t, err)
	defer held.Close()
	l.ConnState(held, http.StateActive)
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	c2, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, l.Close())
	require.ErrorIs(t, testwait.Recv(t, "the waiting Accept", accepted), net.ErrClosed)
}
