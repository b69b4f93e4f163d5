package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// absent is how long a test watches for bytes that must not arrive. It
// proves a stall holds; it is not a wait for something to happen.
const absent = 300 * time.Millisecond

// arrive bounds a wait for bytes that must arrive.
const arrive = 10 * time.Second

// backend is a listener whose accepted connections the test gets.
func backend(t *testing.T) (addr string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ch := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String(), ch
}

func recvConn(t *testing.T, ch <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-ch:
		t.Cleanup(func() { _ = c.Close() })
		return c
	case <-time.After(arrive):
		t.Fatal("no connection reached the backend")
		return nil
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_, err := c.Write([]byte(s))
	require.NoError(t, err)
}

func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(arrive)))
	buf := make([]byte, len(want))
	_, err := io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, want, string(buf))
}

func expectNothing(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(absent)))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.Zero(t, n, "bytes passed a stall: %q", buf[:n])
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// expectClosed waits for the connection to end (EOF or reset).
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(arrive)))
	_, err := io.ReadAll(c)
	if err != nil {
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "connection still open after a cut")
	}
}

func TestProxyStallsOneDirectionAndResumesInOrder(t *testing.T) {
	t.Parallel()
	addr, accepted := backend(t)
	p, err := New(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	c := dial(t, p.Addr())
	s := recvConn(t, accepted)
	send(t, c, "ping")
	expect(t, s, "ping")
	send(t, s, "pong")
	expect(t, c, "pong")

	p.Stall(Upstream)
	send(t, c, "held-1")
	send(t, c, "held-2")
	expectNothing(t, s)
	send(t, s, "down still flows")
	expect(t, c, "down still flows")
	p.Resume()
	expect(t, s, "held-1held-2")

	p.Stall(Downstream)
	send(t, s, "held-3")
	expectNothing(t, c)
	send(t, c, "up still flows")
	expect(t, s, "up still flows")
	// A connection opened during a stall is stalled too.
	c2 := dial(t, p.Addr())
	s2 := recvConn(t, accepted)
	send(t, s2, "new-held")
	expectNothing(t, c2)
	p.Resume()
	expect(t, c, "held-3")
	expect(t, c2, "new-held")
}

func TestProxyCutResetsAndRefusesUntilResume(t *testing.T) {
	t.Parallel()
	addr, accepted := backend(t)
	p, err := New(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	c := dial(t, p.Addr())
	s := recvConn(t, accepted)
	send(t, c, "a")
	expect(t, s, "a")

	p.Cut()
	expectClosed(t, c)
	expectClosed(t, s)
	// New connections are accepted by the proxy's listener and reset at
	// once; none reaches the backend.
	if refused, err := net.Dial("tcp", p.Addr()); err == nil { // a reset can beat the dial's return
		expectClosed(t, refused)
		_ = refused.Close()
	}
	select {
	case bc := <-accepted:
		_ = bc.Close()
		t.Fatal("a connection reached the backend during a cut")
	default:
	}

	p.Resume()
	c3 := dial(t, p.Addr())
	s3 := recvConn(t, accepted)
	send(t, c3, "after")
	expect(t, s3, "after")
	send(t, s3, "back")
	expect(t, c3, "back")
}

func TestProxyCutDuringStallDropsHeldBytesAndCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	addr, accepted := backend(t)
	p, err := New(addr)
	require.NoError(t, err)
	c := dial(t, p.Addr())
	s := recvConn(t, accepted)
	p.Stall(Upstream)
	send(t, c, "lost")
	p.Cut()
	expectClosed(t, s)
	expectClosed(t, c)
	p.Resume()
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.Error(t, err, "a closed proxy still listens")
}
