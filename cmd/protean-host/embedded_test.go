package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestRunWithoutConfigFileRunsTheEmbeddedDefault: run and validate from a
// directory without configs/domain.toml (a handler's own, as the scaffold
// Makefile suggests) and without --config run the embedded default, and
// run's first log line says so; an explicit --config that does not exist
// is still an error.
func TestRunWithoutConfigFileRunsTheEmbeddedDefault(t *testing.T) {
	work := t.TempDir()
	plugins := filepath.Join(work, "build")
	require.NoError(t, os.MkdirAll(plugins, 0o755))
	wasmbuild.Copy(t, wasmbuild.Build(t, "./plugins/examples/orders"), plugins, "orders.wasm")
	// The default [plugins] cache_dir (.cache/wasm, relative to the working
	// directory) is the tests' shared cache: the module compiles once.
	require.NoError(t, os.MkdirAll(filepath.Join(work, ".cache"), 0o755))
	require.NoError(t, os.Symlink(wasmbuild.CacheDir(t), filepath.Join(work, ".cache", "wasm")))
	t.Chdir(work)

	code, _, errs := cli(t, "validate", "--config", defaultConfig, "--plugins", "build")
	require.Equal(t, 1, code, "an explicit --config that does not exist is an error")
	require.Contains(t, errs, "configs/domain.toml: no such file or directory")

	code, out, errs := cli(t, "validate", "--plugins", "build")
	require.Equal(t, 0, code, "validate without a config file:\n%s\n%s", out, errs)
	require.Contains(t, out, "orders")

	h := runCLI(t, "run", "--plugins", "build", "--listen", "127.0.0.1:0", "--watch")
	first, _, _ := strings.Cut(h.stderr.String(), "\n")
	require.Contains(t, first, "running the embedded default (memory stores, inline broker)")
	require.Contains(t, first, "plugins=build")
	code, body := h.postBody(t, "/v1/commands/PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	require.Equal(t, 200, code, body)
	require.Equal(t, 0, h.stop(t), "log:\n%s", h.stderr.Tail(10))
}
