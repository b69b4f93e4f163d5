package main

import (
	"bytes"
	"context"
	"errors"
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

// The real host, reloaded on SIGHUP over a plugins directory that holds a
// named pipe and a link to /dev/urandom (the first blocked every reload for
// ever, the second ran the host out of memory): the reload refuses each
// at once naming it, and adds the good module beside them; once they are
// removed the next SIGHUP finds the directory valid again.
func TestSIGHUPReloadRefusesIrregularFiles(t *testing.T) {
	dir := t.TempDir()
	declared := func(variant string) string {
		return wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant="+variant)
	}
	wasmbuild.Copy(t, declared("projector"), dir, "projector.wasm")
	p := runHost(t, fmt.Sprintf("[plugins]\ndir = %q\ncache_dir = %q\ncache_max_mb = 0\n", dir, wasmbuild.CacheDir(t)), "2s")
	log := func() string {
		b, err := os.ReadFile(p.log)
		require.NoError(t, err)
		return string(b)
	}

	wasmbuild.Copy(t, declared("pm"), dir, "pm.wasm")
	fifo, link := filepath.Join(dir, "zz.wasm"), filepath.Join(dir, "urandom.wasm")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	require.NoError(t, os.Symlink("/dev/urandom", link))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	testwait.For(t, "both files refused by name, pm.wasm added", func() (bool, string) {
		l := log()
		return strings.Contains(l, `file=zz.wasm tenant=default problem="zz.wasm: is a named pipe, not a regular file"`) &&
			strings.Contains(l, `file=urandom.wasm tenant=default problem="urandom.wasm: is a symbolic link out of the plugins directory"`) &&
			strings.Contains(l, `msg="plugin added" file=pm.wasm`) && strings.Contains(l, `msg="plugins reloaded"`), p.Tail()
	})

	require.NoError(t, os.Remove(fifo))
	require.NoError(t, os.Remove(link))
	// The first reload logs its rejection just before it returns: a
	// SIGHUP in between is ignored ("already in progress"), so one is
	// sent again for each that was.
	ignored := 0
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	testwait.For(t, "the next reload valid", func() (bool, string) {
		l := log()
		if n := strings.Count(l, "a reload is already in progress"); n > ignored {
			ignored = n
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		}
		return strings.Contains(l, `msg="plugins directory valid again"`), p.Tail()
	})
	select {
	case <-p.done:
		t.Fatalf("the host exited:\n%s", p.Tail())
	default:
	}
}

// validate over a plugins directory holding a named pipe exits at once,
// non-zero, naming the file (it used to hang in the pipe's open, deaf to
// SIGTERM).
func TestValidateRefusesANamedPipe(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector"), dir, "projector.wasm")
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "zz.wasm"), 0o644))
	cfg := filepath.Join(t.TempDir(), "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("[plugins]\ndir = %q\ncache_dir = %q\ncache_max_mb = 0\n", dir, wasmbuild.CacheDir(t))), 0o644))
	cmd := exec.Command(hostBinary(t), "validate", "--config", cfg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	err := testwait.Recv(t, "validate to exit", done)
	done <- err // for the cleanup
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, out.String())
	require.Equal(t, 1, ee.ExitCode(), out.String())
	require.Contains(t, out.String(), "zz.wasm: is a named pipe, not a regular file")
	require.Contains(t, out.String(), "1 problem(s) in "+dir)
}

// A config file or plugins directory that others may write draws a WARN
// naming it and its mode; [plugins] refuse_writable = true refuses each,
// naming the path.
func TestValidateWritableByOthers(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector"), dir, "projector.wasm")
	require.NoError(t, os.Chmod(dir, 0o777))
	cfg := configFile(t, "inline")
	require.NoError(t, os.Chmod(cfg, 0o666))
	code, out, errs := cli(t, "validate", "--config", cfg, "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "1 modules, 1 handlers: valid")
	require.Regexp(t, `level=WARN msg="writable by other users[^"]*" path=`+cfg+` mode=0666`, errs)
	require.Regexp(t, `level=WARN msg="writable by other users[^"]*" path=`+dir+` mode=0777`, errs)

	refuse := func(cfg string) string {
		b, err := os.ReadFile(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(cfg, bytes.Replace(b, []byte("[plugins]\n"), []byte("[plugins]\nrefuse_writable = true\n"), 1), 0o644))
		return cfg
	}
	cfg = refuse(configFile(t, "inline"))
	code, _, errs = cli(t, "validate", "--config", cfg, "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "plugins directory "+dir+" is writable by other users (mode 0777)")

	require.NoError(t, os.Chmod(cfg, 0o666))
	code, _, errs = cli(t, "validate", "--config", cfg, "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "protean-host validate: config "+cfg+" is writable by other users (mode 0666)")
}

// validate interrupted while it loads (main cancels the context on SIGINT
// and SIGTERM) stops loading and says so, instead of listing the modules
// it did not load as problems.
func TestValidateInterrupted(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bomb.wasm"), wasmbuild.CompileBomb(150000), 0o644))
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("terminated signal received"))
	var out, errb bytes.Buffer
	code := run(ctx, []string{"validate", "--config", configFile(t, "inline"), "--plugins", dir}, &out, &errb)
	require.Equal(t, 1, code)
	require.Contains(t, errb.String(), "protean-host validate: loading "+dir+": terminated signal received")
	require.NotContains(t, errb.String(), "problem(s)")
}
