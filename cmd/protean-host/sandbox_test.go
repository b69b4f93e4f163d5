package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// SIGTERM while a SIGHUP reload compiles a compile bomb (a valid module
// that takes minutes to compile; compile_timeout_ms is set far above that
// here, so only the shutdown can end it): the host hears the signal,
// cancels the reload (the compilation is abandoned, not waited for) and
// exits after its drain, reporting the reload as canceled, not as a
// timeout.
func TestSIGTERMDuringReloadCompile(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./host/testdata/plugins/behave"), dir, "behave.wasm")
	p := runHost(t, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
[plugins.limits]
compile_timeout_ms = 3600000
`, dir, wasmbuild.CacheDir(t)), "2s")
	addr := p.addr

	// ~150000 nested blocks: minutes of compiling, far past the wait limit.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bomb.wasm"), wasmbuild.CompileBomb(150000), 0o644))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	testwait.For(t, "the reload to begin", func() (bool, string) {
		return strings.Contains(p.tail(), "SIGHUP: reloading plugins"), p.tail()
	})
	// The HTTP API keeps answering while the reload compiles.
	r, err := send("POST", "http://"+addr+"/v1/commands/Increment", `{"id":"x"}`)
	require.NoError(t, err)
	require.Equal(t, 200, r.code, r.String())

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	testwait.For(t, "the host to exit after SIGTERM, not after the compilation", func() (bool, string) {
		select {
		case <-p.done:
			return true, ""
		default:
			return false, p.tail()
		}
	})
	log, err := os.ReadFile(p.log)
	require.NoError(t, err)
	require.Contains(t, string(log), "plugin reload canceled; the running set stays")
	require.NotContains(t, string(log), "did not return in time")
	require.Equal(t, 0, p.cmd.ProcessState.ExitCode(), "%s", log)
}

// runHost starts `protean-host run` as a child process with the config
// body (an [http] listen on a free port is added), --shutdown-timeout
// drain, its output in p.log, and waits until it is healthy. The process is
// killed at the test's end if it still runs.
func runHost(t *testing.T, body, drain string) *process {
	t.Helper()
	addr := freeAddr(t)
	tmp := t.TempDir()
	cfg := filepath.Join(tmp, "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(body+fmt.Sprintf("\n[http]\nlisten = %q\n", addr)), 0o644))
	p := &process{addr: addr, log: filepath.Join(tmp, "host.log"), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd = exec.Command(hostBinary(t), "run", "--config", cfg, "--shutdown-timeout", drain)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); _ = logf.Close(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	testwait.For(t, "the host healthy", func() (bool, string) {
		r, err := send("GET", "http://"+addr+"/healthz", "")
		return err == nil && r.code == 200, fmt.Sprintf("%v %v\n%s", r, err, p.tail())
	})
	return p
}
