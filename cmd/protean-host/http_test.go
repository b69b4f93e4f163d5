package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// The real host with http.max_connections = 100 and 200 connections held
// open by one client (100 idle keep-alives after a request, 100 connected
// and silent): a new client's command is still answered, the oldest idle
// connections closed to make room; and a body that stops coming is cut at
// http.read_body_timeout_ms with 408.
func TestIdleConnectionsDoNotShutOutANewClient(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	p := runHostHTTP(t, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
`, dir, wasmbuild.CacheDir(t)), "max_connections = 100\nread_body_timeout_ms = 200\n", "2s")

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(testwait.Limit())))
		return c, bufio.NewReader(c)
	}
	for range 100 {
		c, r := dial()
		_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.Equal(t, 200, resp.StatusCode)
	}
	for range 100 {
		dial()
	}
	r, err := send("POST", "http://"+p.addr+"/v1/commands/Increment", `{"id":"x"}`)
	require.NoError(t, err)
	require.Equal(t, 200, r.code, r.String())
	m := do(t, "GET", "http://"+p.addr+"/metrics", "")
	open, evicted := metric(t, m.raw, "protean_http_connections_open"), metric(t, m.raw, "protean_http_connections_evicted_total")
	require.LessOrEqual(t, open, 100.0, "the host holds at most max_connections")
	require.GreaterOrEqual(t, evicted, 102.0, "the oldest idle made room for the rest of the 200 and the two new clients")

	c, br := dial()
	_, err = io.WriteString(c, "POST /v1/commands/Increment HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"id\":")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "a slow body is answered, not left open")
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
}

// metric reads an unlabeled metric's value from Prometheus text.
func metric(t *testing.T, text, name string) float64 {
	t.Helper()
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no metric %s in\n%s", name, text)
	return 0
}
