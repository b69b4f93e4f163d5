package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// embedCLI runs `plugin embed-manifest` on path and returns the file's
// bytes after it.
func embedCLI(t *testing.T, path string) (stdout string, b []byte) {
	t.Helper()
	code, out, errs := cli(t, "plugin", "embed-manifest", "--config", configFile(t, "inline"), path)
	require.Equal(t, 0, code, "stderr: %s", errs)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return out, b
}

// embed-manifest writes the manifest the module answers into its file,
// keeping the file's mode; running it again changes nothing.
func TestPluginEmbedManifest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client_orders.wasm")
	wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), filepath.Dir(path), filepath.Base(path))
	require.NoError(t, os.Chmod(path, 0o640))
	plain, err := os.ReadFile(path)
	require.NoError(t, err)
	_, ok, err := abi.EmbeddedManifest(plain)
	require.NoError(t, err)
	require.False(t, ok, "the built module has no section yet")

	out, once := embedCLI(t, path)
	require.Contains(t, out, "client_orders")
	require.Contains(t, out, "embedded")
	raw, ok, err := abi.EmbeddedManifest(once)
	require.NoError(t, err)
	require.True(t, ok, "the section was added")
	man, err := abi.DecodeManifest(raw)
	require.NoError(t, err)
	require.Equal(t, "client_orders", man.Module.Name)
	without, err := abi.RemoveManifest(once)
	require.NoError(t, err)
	require.Equal(t, plain, without, "nothing else of the module changed")
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), st.Mode().Perm())

	out, twice := embedCLI(t, path)
	require.Equal(t, once, twice, "running it twice gives the same bytes")
	require.Contains(t, out, "already embedded")
	leftovers, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp"))
	require.NoError(t, err)
	require.Empty(t, leftovers)

	// A stale section (the module's answer changed since) is replaced,
	// not refused as a load would refuse it.
	stale, err := abi.EmbedManifest(plain, []byte(`{"abi_version": 1}`))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, stale, 0o640))
	_, fixed := embedCLI(t, path)
	require.Equal(t, once, fixed)
}

// A file that is not a module is reported by name, and the command fails.
func TestPluginEmbedManifestRefusesWhatIsNotAModule(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.wasm")
	require.NoError(t, os.WriteFile(path, []byte("not wasm"), 0o644))
	code, _, errs := cli(t, "plugin", "embed-manifest", "--config", configFile(t, "inline"), path)
	require.Equal(t, 1, code)
	require.Contains(t, errs, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "not wasm", string(b), "the file is left as it was")
}
