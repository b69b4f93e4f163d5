package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// A start on an empty cache directory reads every module's manifest on
// the interpreter, and a start on the cache it filled loads every module
// from its manifest memo: neither compiles a module before it serves. The
// second serves at once: a command is answered, and /healthz reads
// "starting" (with the modules still compiling) until the background
// compiles end, then "ok".
// compiledOnly returns a new cache directory holding the compiled code of
// the tests' shared one (linked), and none of its manifest memos: a start
// on it reads manifests on the interpreter, but compiles natively from the
// cache (a cold native compile under -race takes minutes).
func compiledOnly(t *testing.T) string {
	t.Helper()
	cache := t.TempDir()
	dirs, err := filepath.Glob(filepath.Join(wasmbuild.CacheDir(t), "wazero-*"))
	require.NoError(t, err)
	for _, d := range dirs {
		to := filepath.Join(cache, filepath.Base(d))
		require.NoError(t, os.MkdirAll(to, 0o755))
		files, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, f := range files {
			if f.Type().IsRegular() && !strings.HasSuffix(f.Name(), ".tmp") {
				require.NoError(t, os.Link(filepath.Join(d, f.Name()), filepath.Join(to, f.Name())))
			}
		}
	}
	return cache
}

// warmedUp waits until h's /healthz reads "ok": the modules a start
// loaded from their manifest memos are compiled. Meanwhile it reads
// "starting", with the modules still compiling.
func warmedUp(t *testing.T, h *testHost) {
	t.Helper()
	eventually(t, h, "the background compiles ended", func() (bool, string) {
		r := get(t, h, "/healthz")
		if r.code != 200 {
			return false, r.String()
		}
		if r.body["status"] == "starting" {
			require.Positive(t, r.body["compiling"], r.raw)
		}
		return r.body["status"] == "ok", r.String()
	})
}

func TestAWarmStartLoadsFromManifestMemos(t *testing.T) {
	dir := wasmbuild.Examples(t)
	cache := compiledOnly(t)
	own := func(c *config.Config) { c.Plugins.CacheDir = cache }
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	loaded := func(h *testHost, memo bool) {
		t.Helper()
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".wasm") {
				require.Regexp(t, `msg="module loaded" file=`+regexp.QuoteMeta(e.Name())+` .* memo=`+map[bool]string{true: "true", false: "false"}[memo]+` section=false compiled=false`,
					h.logs.String())
			}
		}
	}
	first, err := startHostWith(t, "domain.toml", dir, own)
	require.NoError(t, err)
	loaded(first, false)

	second, err := startHostWith(t, "domain.toml", dir, own)
	require.NoError(t, err)
	loaded(second, true)
	r := post(t, second, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, r.code, r.raw)
	warmedUp(t, second)
	doc := projected(t, second, "the client_orders projection", "/v1/projections/client_orders/c-1")
	require.JSONEq(t, `{"client_id":"c-1","orders":1,"total":42.5,"order_ids":["o-1"]}`, doc.raw)
}
