package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// make dev's loop (scripts/dev.sh): a module's source changes, the script
// rebuilds it into the plugins directory, and the host started with
// --watch serves the new version, and the script says it is live; a build
// the host refuses is told as rejected with its reason; a change that does
// not compile leaves the running version serving. MODULES is here a parent
// directory: a module created in it while dev runs is built and served.
// The plugins directory is dev's own: it serves exactly MODULES, and a
// module file left there by an earlier run is deleted.
func TestDevRebuildsOnChange(t *testing.T) {
	work := t.TempDir()
	handlers := filepath.Join(work, "handlers")
	mod := filepath.Join(handlers, "dev_totals")
	code, _, errs := cli(t, "plugin", "new", "dev_totals", "--kind", "projector", "--category", "dev",
		"--dir", mod, "--host-src", wasmbuild.Root())
	require.Equal(t, 0, code, errs)
	plugins := filepath.Join(work, "plugins")
	require.NoError(t, os.MkdirAll(plugins, 0o755))
	stale := filepath.Join(plugins, "stale.wasm") // not a module: the host would refuse to start on it
	require.NoError(t, os.WriteFile(stale, []byte("left by an earlier make dev"), 0o644))
	bin := filepath.Join(work, "protean-host")
	build := exec.Command("go", "build", "-o", bin, "./cmd/protean-host")
	build.Dir = wasmbuild.Root()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	logs := &testlog.Buffer{}
	dev := exec.Command("bash", "scripts/dev.sh", plugins, configFile(t, "inline"), handlers)
	dev.Dir = wasmbuild.Root()
	dev.Env = append(os.Environ(), "HOST_BIN="+bin, "RUN_FLAGS=--listen 127.0.0.1:0", "DEV_POLL=0.2",
		"GOPROXY=off")
	dev.Stdout, dev.Stderr = logs, logs
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the script and the host it starts: one group to stop
	require.NoError(t, dev.Start())
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGTERM)
		testwait.Recv(t, "make dev's script to exit", exited)
	})

	h := &cliHost{stderr: logs}
	testwait.For(t, "the host listening", func() (bool, string) {
		m := listening.FindStringSubmatch(logs.String())
		if m == nil {
			return false, logs.Tail(5)
		}
		h.addr = m[1]
		return true, ""
	})
	version := func(v string) func() (bool, string) {
		return func() (bool, string) {
			code, body := h.get(t, "/v1/plugins")
			return code == 200 && strings.Contains(body, `"version":"`+v+`"`), fmt.Sprintf("%d %s; log:\n%s", code, body, logs.Tail(8))
		}
	}
	testwait.For(t, "version 0.1.0 served", version("0.1.0"))
	require.NoFileExists(t, stale)
	code, body := h.get(t, "/v1/plugins")
	require.Equal(t, 200, code)
	var served struct {
		Plugins []struct {
			File string `json:"file"`
		} `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &served))
	require.Len(t, served.Plugins, 1, "only dev_totals is served: %s", body)
	require.Equal(t, "dev_totals.wasm", served.Plugins[0].File)

	// A module created in the parent while dev runs.
	code, _, errs = cli(t, "plugin", "new", "dev_added", "--kind", "projector", "--category", "dev_added",
		"--dir", filepath.Join(handlers, "dev_added"), "--host-src", wasmbuild.Root())
	require.Equal(t, 0, code, errs)
	testwait.For(t, "the new module built and served", func() (bool, string) {
		code, body := h.get(t, "/v1/plugins")
		return code == 200 && strings.Contains(body, "dev_added"), fmt.Sprintf("%d %s; log:\n%s", code, body, logs.Tail(8))
	})

	src := filepath.Join(mod, "main.go")
	edit := func(old, new string) {
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.True(t, bytes.Contains(b, []byte(old)), "main.go has %q", old)
		require.NoError(t, os.WriteFile(src, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644))
	}
	edit(`pdk.Module("dev_totals", "0.1.0")`, `pdk.Module("dev_totals", "0.2.0")`)
	testwait.For(t, "the edit rebuilt and reloaded", version("0.2.0"))
	testwait.For(t, "the script told it live", func() (bool, string) {
		return strings.Contains(logs.String(), "dev: dev_totals live (version 0.2.0)"), logs.Tail(5)
	})

	// A build the host refuses: the script says so, with the reason, not
	// "built".
	edit(`.SequentialBy("id")`, `.SequentialBy("nope")`)
	testwait.For(t, "the rejection told", func() (bool, string) {
		return strings.Contains(logs.String(), "dev: dev_totals rejected: dev_totals.wasm: handler dev_totals (projector) declares sequential_by = \"nope\""), logs.Tail(5)
	})
	edit(`.SequentialBy("nope")`, `.SequentialBy("id")`)
	testwait.For(t, "the script told the fix live", func() (bool, string) {
		return strings.Count(logs.String(), "dev: dev_totals live (version 0.2.0)") == 2, logs.Tail(5)
	})

	edit(`func main() {}`, `func main() { not go }`)
	testwait.For(t, "the failed build reported", func() (bool, string) {
		return strings.Contains(logs.String(), "failed; the running module is unchanged"), logs.Tail(5)
	})
	ok, seen := version("0.2.0")()
	require.True(t, ok, "still serving 0.2.0: %s", seen)
}

// make run, validate and dev run the host on the directory they build
// into: PLUGINS_DIR reaches --plugins (make run used to build into it and
// run build/plugins), and DEV_PLUGINS_DIR, make dev's own, reaches
// scripts/dev.sh.
func TestMakePassesPluginsDir(t *testing.T) {
	for _, target := range []string{"run", "validate", "dev"} {
		mk := exec.Command("make", "-n", target, "PLUGINS_DIR=/tmp/elsewhere", "DEV_PLUGINS_DIR=/tmp/dev-elsewhere")
		mk.Dir = wasmbuild.Root()
		out, err := mk.CombinedOutput()
		require.NoError(t, err, "make -n %s:\n%s", target, out)
		require.Regexp(t, `(protean-host (run|validate) --config \S+ --plugins /tmp/elsewhere|scripts/dev\.sh /tmp/dev-elsewhere)`, string(out), "make %s", target)
	}
}
