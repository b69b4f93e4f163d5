package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// keysHost is the real host over one module, its config file rewritten
// by the test between SIGHUPs.
type keysHost struct {
	*process
	cfg, plugins, listen string
}

// runKeysHost starts the host listening on listen (host:port; "" for a
// free loopback port) with auth's lines under [http].
func runKeysHost(t *testing.T, listen, authLines string) *keysHost {
	t.Helper()
	addr := freeAddr(t)
	if listen == "" {
		listen = addr
	} else {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		listen = net.JoinHostPort(listen, port)
	}
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector"), dir, "projector.wasm")
	tmp := t.TempDir()
	h := &keysHost{cfg: filepath.Join(tmp, "host.toml"), plugins: dir, listen: listen}
	h.write(t, authLines)
	h.process = startProcess(t, addr, h.cfg, tmp, nil)
	return h
}

// write rewrites the config file with auth's lines under [http].
func (h *keysHost) write(t *testing.T, authLines string) {
	t.Helper()
	body := fmt.Sprintf("[plugins]\ndir = %q\ncache_dir = %q\ncache_max_mb = 0\n[http]\nlisten = %q\n%s", h.plugins, wasmbuild.CacheDir(t), h.listen, authLines)
	require.NoError(t, os.WriteFile(h.cfg, []byte(body), 0o600))
}

func (h *keysHost) hup(t *testing.T) {
	t.Helper()
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGHUP))
}

func (h *keysHost) logText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(h.log)
	require.NoError(t, err)
	return string(b)
}

// code is the status of GET /v1/plugins (an admin's route) with key ("":
// no Authorization).
func (h *keysHost) code(t *testing.T, key string) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+h.addr+"/v1/plugins", nil)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// adminKeys returns n new keys and the [[http.auth.keys]] lines of each
// (admin keys).
func adminKeys(t *testing.T, n int) ([]string, []string) {
	t.Helper()
	var keys, lines []string
	for range n {
		k, hash, err := auth.NewKey()
		require.NoError(t, err)
		keys = append(keys, k)
		lines = append(lines, fmt.Sprintf("[[http.auth.keys]]\nrole = \"admin\"\nsha256 = %q\n", hash))
	}
	return keys, lines
}

// TestSIGHUPReloadsTheAPIKeys: keys A and B configured; the config
// rewritten without A and with a new key C; after SIGHUP, A is refused
// (401), B still works and C works, and the log names the key ids added
// and removed, never a key.
func TestSIGHUPReloadsTheAPIKeys(t *testing.T) {
	keys, lines := adminKeys(t, 3)
	a, b, c := keys[0], keys[1], keys[2]
	h := runKeysHost(t, "", lines[0]+lines[1])
	require.Equal(t, 200, h.code(t, a))
	require.Equal(t, 200, h.code(t, b))
	require.Equal(t, 401, h.code(t, c))
	require.Equal(t, 401, h.code(t, ""))

	h.write(t, lines[1]+lines[2])
	h.hup(t)
	testwait.For(t, "the removed key A refused", func() (bool, string) {
		code := h.code(t, a)
		return code == 401, fmt.Sprintf("%d\n%s", code, h.Tail())
	})
	require.Equal(t, 200, h.code(t, b), "B, in both configs, still works")
	require.Equal(t, 200, h.code(t, c), "the added key C works")
	require.Equal(t, 401, h.code(t, ""))

	id := func(k string) string { return regexp.QuoteMeta(auth.KeyID(auth.Hash(k))) }
	l := h.logText(t)
	require.Regexp(t, `msg="SIGHUP: credentials reloaded from \[http.auth\] \(other config sections take a restart\)".* api_keys=2 `+
		`.*keys_added="?\[`+id(c)+`\]"? keys_removed="?\[`+id(a)+`\]"?`, l)
	for _, k := range keys {
		require.NotContains(t, l, k, "a key in the log")
		require.NotContains(t, l, auth.Hash(k), "a key's whole hash in the log")
	}
}

// TestSIGHUPKeepsTheKeysOfABadConfig: a config that no longer parses,
// one that no longer validates, and one that removes every credential
// from a host listening on every interface: each SIGHUP logs why it was
// refused, and the running keys stay (the key works, no key is 401).
func TestSIGHUPKeepsTheKeysOfABadConfig(t *testing.T) {
	keys, lines := adminKeys(t, 1)
	h := runKeysHost(t, "0.0.0.0", lines[0])
	require.Equal(t, 200, h.code(t, keys[0]))
	for i, c := range []struct{ name, lines, logged string }{
		{"does not parse", "[http.auth\n", "toml:"},
		{"does not validate", "[[http.auth.keys]]\nrole = \"admin\"\nsha256 = \"not-hex\"\n", "sha256 must be 64 hex digits"},
		{"no credentials on a non-loopback listener", "", "refused, as at start: http.listen " + h.listen + " is not a loopback address"},
	} {
		h.write(t, c.lines)
		h.hup(t)
		testwait.For(t, c.name+": the refusal logged", func() (bool, string) {
			l := h.logText(t)
			n := strings.Count(l, `msg="SIGHUP: credentials not reloaded; the running ones stay"`)
			return n == i+1 && strings.Contains(l, c.logged), h.Tail()
		})
		require.Equal(t, 200, h.code(t, keys[0]), c.name)
		require.Equal(t, 401, h.code(t, ""), c.name)
	}
	require.NotContains(t, h.logText(t), "credentials reloaded")
	// Fixed, the file applies again.
	h.write(t, lines[0])
	h.hup(t)
	testwait.For(t, "the fixed config applied", func() (bool, string) {
		return strings.Contains(h.logText(t), "credentials reloaded"), h.Tail()
	})
	require.Equal(t, 200, h.code(t, keys[0]))
}
