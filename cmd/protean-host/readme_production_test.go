package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// README "Production mode" from a fresh clone: its commands, as README
// writes them, start a private PostgreSQL and Redis (scripts/services.sh
// up), build, migrate and serve (make production); then the quickstart's
// PlaceOrder is posted and its projection read at the command's position.
// Only where things go is redirected, so the checkout's build/ is left
// alone: the services' state directory, the binary, the plugins and the
// listen address (a free port). The servers are stopped by
// services.sh down whatever happens. Missing server binaries fail it (or
// are installed, as root), as internal/testserver does.
func TestReadmeProductionQuickstart(t *testing.T) {
	for _, tool := range []string{"bash", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("README's production commands need %s: %v", tool, err)
		}
	}
	root := wasmbuild.Root()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	commands := readmeProductionCommands(t, string(readme))
	require.LessOrEqual(t, len(commands), 3, "README promises production mode in at most three commands: %q", commands)

	// The state directory: the postgres user (when running as root) must
	// reach it, and t.TempDir's parent is private.
	state, err := os.MkdirTemp("", "protean-readme-production-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	require.NoError(t, os.Chmod(state, 0o755))
	build := t.TempDir()
	env := append(withoutEnv(os.Environ(), "PROTEAN_DATABASE_URL", "PROTEAN_REDIS_URL"),
		"PROTEAN_SERVICES_DIR="+filepath.Join(state, "services"),
		"HOST_BIN="+filepath.Join(build, "protean-host"),
		"PLUGINS_DIR="+filepath.Join(build, "plugins"),
		"RUN_FLAGS=--listen 127.0.0.1:0",
	)
	t.Cleanup(func() {
		down := exec.Command("scripts/services.sh", "down")
		down.Dir, down.Env = root, env
		out, err := down.CombinedOutput()
		if err != nil {
			t.Errorf("scripts/services.sh down: %v\n%s", err, out)
		}
	})

	// One shell runs README's lines in order (the exports of the first
	// reach the others), in a process group of its own to stop at the end.
	sh := exec.Command("bash", "-c", "set -euo pipefail\n"+strings.Join(commands, "\n"))
	sh.Dir, sh.Env = root, env
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var output testlog.Buffer
	sh.Stdout, sh.Stderr = &output, &output
	require.NoError(t, sh.Start())
	exited := make(chan error, 1)
	go func() { exited <- sh.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-sh.Process.Pid, syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(testwait.Limit()):
			_ = syscall.Kill(-sh.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})

	// Building from a cold cache takes minutes on a loaded machine: a
	// generous bound, and an early end if the commands fail.
	var addr string
	deadline := time.Now().Add(10 * testwait.Limit())
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for addr == "" {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("README's production commands ended (%v) before the host listened:\n%s", err, output.String())
		case <-tick.C:
		}
		if m := listening.FindStringSubmatch(output.String()); m != nil {
			addr = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host did not listen within %s:\n%s", 10*testwait.Limit(), output.String())
		}
	}
	out := output.String()
	require.Contains(t, out, "schema at version", "make production migrated")
	require.Contains(t, out, "AOF appendfsync always")

	h := &cliHost{addr: addr}
	// As the README says: a first start serves at once and compiles the
	// modules in the background; /healthz reads "ok" once they are.
	testwait.For(t, "the modules compiled", func() (bool, string) {
		code, body := h.get(t, "/healthz")
		return code == 200 && strings.Contains(body, `"status":"ok"`), fmt.Sprintf("%d %s", code, body)
	})
	position := h.command(t, "/v1/commands/PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)
	testwait.For(t, "the order projected through PostgreSQL and Redis", func() (bool, string) {
		code, body := h.get(t, fmt.Sprintf("/v1/projections/client_orders/c-1?min_position=%d", position))
		return code == 200 && strings.Contains(body, `"order_ids":["o-1"]`), fmt.Sprintf("%d %s; log:\n%s", code, body, output.Tail(10))
	})

	// The event went where the exports said: the private PostgreSQL, as
	// the role services.sh created.
	envCmd := exec.Command("scripts/services.sh", "env")
	envCmd.Dir, envCmd.Env = root, env
	exports, err := envCmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(exports), "export PROTEAN_REDIS_URL='redis://127.0.0.1:")
	psql := exec.Command("bash", "-c", `eval "$(scripts/services.sh env)" && psql "$PROTEAN_DATABASE_URL" -Atc "SELECT current_user, count(*) FROM message_store.messages WHERE stream_name = 'order-o-1'"`)
	psql.Dir, psql.Env = root, env
	rows, err := psql.CombinedOutput()
	require.NoError(t, err, "%s", rows)
	require.Equal(t, "protean|1", strings.TrimSpace(string(rows)))

	// down stops both servers by their pids, however the directory is
	// spelled (here with a ./ and a trailing slash).
	var pids []int
	for _, name := range []string{"postgres.pid", "redis.pid"} {
		b, err := os.ReadFile(filepath.Join(state, "services", name))
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	down := exec.Command("scripts/services.sh", "down")
	down.Dir, down.Env = root, append(env, "PROTEAN_SERVICES_DIR="+state+"/./services/")
	b, err := down.CombinedOutput()
	require.NoError(t, err, "%s", b)
	for _, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pid %d after services.sh down:\n%s", pid, b)
	}
}

// readmeProductionCommands returns the command lines of the first sh block
// of README's "Production mode".
func readmeProductionCommands(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Production mode\n")
	require.True(t, ok, "README has a Production mode section")
	_, block, ok := strings.Cut(section, "```sh\n")
	require.True(t, ok, "README's Production mode has an sh block")
	block, _, _ = strings.Cut(block, "```")
	var commands []string
	for _, line := range strings.Split(block, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commands = append(commands, line)
		}
	}
	require.NotEmpty(t, commands)
	return commands
}

// withoutEnv drops the named variables from env.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, n := range names {
			keep = keep && !strings.HasPrefix(kv, n+"=")
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
