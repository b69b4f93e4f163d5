package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// buildCommand is the one command every path that builds a Go module for
// the user runs, in the module's directory.
const buildCommand = "GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o "

// One source, one set of bytes: make plugins (make run), scripts/dev.sh
// (make dev, through scripts/build-module.sh) and a scaffolded module's
// make build write the same module, so switching between them finds it in
// the compiled-code cache instead of compiling it again (13-38 s for the
// examples). make plugins without -trimpath wrote other bytes.
func TestOneBuildOfAModule(t *testing.T) {
	root := wasmbuild.Root()
	work := t.TempDir()
	example := filepath.Join(root, "plugins", "examples", "orders")

	// make plugins, for one example.
	mk := exec.Command("make", "plugins", "EXAMPLES=orders", "PLUGINS_DIR="+filepath.Join(work, "make"))
	mk.Dir = root
	out, err := mk.CombinedOutput()
	require.NoError(t, err, "make plugins:\n%s", out)
	viaMake := readFile(t, filepath.Join(work, "make", "orders.wasm"))

	// scripts/dev.sh's build: scripts/build-module.sh.
	dev, err := os.ReadFile(filepath.Join(root, "scripts", "dev.sh"))
	require.NoError(t, err)
	require.Contains(t, string(dev), `"$here/build-module.sh" "$dir" "$out"`, "dev.sh builds through scripts/build-module.sh")
	script := exec.Command("scripts/build-module.sh", "plugins/examples/orders", filepath.Join(work, "script.wasm"))
	script.Dir = root
	out, err = script.CombinedOutput()
	require.NoError(t, err, "scripts/build-module.sh:\n%s", out)
	require.NoFileExists(t, filepath.Join(work, "script.wasm.tmp"))
	viaScript := readFile(t, filepath.Join(work, "script.wasm"))

	// The scaffold's make build: its literal command, run in the module's
	// directory.
	tmpl, err := os.ReadFile(filepath.Join(root, "cmd", "protean-host", "scaffold", "Makefile.tmpl"))
	require.NoError(t, err)
	line := regexp.MustCompile(`(?m)^\t(GOOS=.*go build .*)$`).FindStringSubmatch(string(tmpl))
	require.NotNil(t, line, "the scaffold's Makefile has a go build line")
	require.True(t, strings.HasPrefix(line[1], buildCommand), "the scaffold builds with %q: %s", buildCommand, line[1])
	scaffold := exec.Command("sh", "-c", strings.Replace(line[1], "build/{{.Name}}.wasm.tmp", filepath.Join(work, "scaffold.wasm"), 1))
	scaffold.Dir = example
	out, err = scaffold.CombinedOutput()
	require.NoError(t, err, "%s:\n%s", line[1], out)
	viaScaffold := readFile(t, filepath.Join(work, "scaffold.wasm"))

	require.True(t, bytes.Equal(viaMake, viaScript), "make plugins and scripts/build-module.sh wrote different bytes (%d and %d)", len(viaMake), len(viaScript))
	require.True(t, bytes.Equal(viaScript, viaScaffold), "scripts/build-module.sh and the scaffold wrote different bytes (%d and %d)", len(viaScript), len(viaScaffold))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
