package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// SIGTERM while a SIGHUP reload compiles a compile bomb (a valid module
// that takes minutes to compile; the shape limits and compile_timeout_ms are raised far above it
// here, so only the shutdown can end it): the host hears the signal,
// cancels the reload (the compilation is abandoned, not waited for) and
// exits after its drain, reporting the reload as canceled, not as a
// timeout.
func TestSIGTERMDuringReloadCompile(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	p := runHost(t, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[plugins.limits]
compile_timeout_ms = 3600000
max_nesting_depth = 1000000
max_nesting_cost = 100000000000
`, dir, wasmbuild.CacheDir(t)), "2s")
	addr := p.addr

	// ~150000 nested blocks: minutes of compiling, far past the wait limit.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bomb.wasm"), wasmbuild.CompileBomb(150000), 0o644))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	testwait.For(t, "the reload to begin", func() (bool, string) {
		return strings.Contains(p.Tail(), "SIGHUP: reloading plugins"), p.Tail()
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
			return false, p.Tail()
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
func runHost(t testing.TB, body, drain string) *process {
	t.Helper()
	return runHostEnv(t, body, drain)
}

// runHostEnv is runHost with extra environment variables (KEY=VALUE).
func runHostEnv(t testing.TB, body, drain string, env ...string) *process {
	t.Helper()
	return runHostHTTP(t, body, "", drain, env...)
}

// runHostHTTP is runHostEnv with more keys of the [http] table (lines).
func runHostHTTP(t testing.TB, body, http, drain string, env ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	tmp := t.TempDir()
	cfg := filepath.Join(tmp, "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(body+fmt.Sprintf("\n[http]\nlisten = %q\n%s", addr, http)), 0o644))
	return startProcess(t, addr, cfg, tmp, []string{"--shutdown-timeout", drain}, env...)
}

// TestHostileTenantIsContained runs the real host with two tenants: shop
// (the example orders module) and evil (the behave and intruder test
// modules). While evil's modules run away, exhaust memory, overflow their
// stack, return huge output, exit, cascade without end, call the host a
// million times and reach into the shop's data, every one is refused or stopped with an error naming the
// module and the limit or the rule, the shop's commands keep answering
// (counted, not timed), and the process's resident memory stays within
// the sum of the configured per-instance bounds plus a fixed overhead.
func TestHostileTenantIsContained(t *testing.T) {
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	wasmbuild.Copy(t, filepath.Join(examples, "orders.wasm"), dir, "orders.wasm")
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/intruder"), dir, "intruder.wasm")
	const (
		memoryMB  = 32
		outputMB  = 1
		instances = 2 // GOMAXPROCS of the child is capped below
		modules   = 3
		overhead  = 384 << 20
	)
	p := runHostEnv(t, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[plugins.limits]
timeout_ms = 3000
memory_mb = %d
max_output_bytes = %d
[server.stream_subscription]
max_retries = 1
retry_delay_seconds = 0.05
[tenants.shop]
modules = ["orders"]
grant_read = { evil = ["order"] }
[tenants.evil]
modules = ["behave", "intruder"]
`, dir, wasmbuild.CacheDir(t), memoryMB, outputMB<<20), "5s", "GOMAXPROCS=2")
	base := "http://" + p.addr

	// The shop's traffic, all along: every command must answer 200, once
	// its module's code has compiled.
	sendReady(t, base+"/v1/commands/PlaceOrder", `{"order_id":"o-warm","client_id":"c-1","total":1}`)
	shop := startShopTraffic(base)
	count := shop.count
	before := count()

	cmd := func(typ, body string) reply {
		return postReady(t, base+"/v1/commands/"+typ, body)
	}
	for _, tc := range []struct{ typ, body, want string }{
		{"Slow", `{"id":"a","ms":600000}`, "behave.wasm: handler slow: call exceeded its deadline (limit 3s)"},
		{"Trespass", `{"op":"write","id":"x"}`, "(tenant evil): projection client_orders is not a projector or process manager of the module"},
		{"Intrude", `{"op":"emit","id":"o-1"}`, "intruder.wasm (tenant evil): may not append OrderPlaced to stream order-o-1: category order belongs to another tenant"},
		{"Intrude", `{"op":"write","id":"o-1"}`, "may not write aggregates of category order: it belongs to another tenant"},
		{"Intrude", `{"op":"dispatch","id":"o-1"}`, "may not dispatch command CancelOrder: it belongs to another tenant"},
		{"Intrude", `{"op":"read_payment","id":"o-1"}`, "may not read stream payment-o-1"},
	} {
		r := cmd(tc.typ, tc.body)
		require.NotEqual(t, 200, r.code, "%s %s", tc.typ, tc.body)
		require.Contains(t, r.raw, tc.want, "%s %s", tc.typ, tc.body)
		require.NotContains(t, r.raw, "shop", "a refusal does not name another tenant: %s %s", tc.typ, tc.body)
	}
	// A cascade that feeds itself ends at the budget.
	require.Equal(t, 200, cmd("Again", `{"id":"x"}`).code)
	// Deliveries that run away, each through the broker to evil's handler.
	for _, op := range []string{"loop", "oom", "stack", "big", "exit0"} {
		require.Equal(t, 200, cmd("EmitOp", fmt.Sprintf(`{"op":%q,"id":%q}`, op, op)).code, op)
	}
	// A million loads in one call: stopped at max_host_calls.
	require.Equal(t, 200, cmd("EmitOp", `{"op":"load_flood","id":"flood","arg":"1000000"}`).code)
	testwait.For(t, "every hostile delivery contained", func() (bool, string) {
		r, err := send("GET", base+"/metrics", "")
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, l := range strings.Split(r.raw, "\n") {
			if strings.HasPrefix(l, "protean_handler_calls_total{") && strings.Contains(l, `handler="behave"`) {
				seen = append(seen, l)
			}
		}
		all := strings.Join(seen, "\n")
		return strings.Contains(all, `outcome="timeout"`) && strings.Contains(all, `outcome="trap"`) &&
			strings.Contains(all, `outcome="output"`) && strings.Contains(all, `outcome="host_limit"`), all
	})
	log := p.Tail()
	full, err := os.ReadFile(p.log)
	require.NoError(t, err)
	require.Contains(t, string(full), "max_cascade_depth 16", "the cascade was cut at its budget:\n%s", log)
	require.Contains(t, string(full), "behave.wasm: handler behave: host-function budget exceeded: load: 10001 host calls (limit max_host_calls = 10000)")

	// The shop kept flowing while all that ran.
	testwait.For(t, "the shop's commands to keep answering", func() (bool, string) {
		n := count()
		return n > before+10, fmt.Sprintf("%d placed (%d before the hostile work)", n, before)
	})
	require.Empty(t, shop.stop(), "the shop's commands answered 200 throughout")

	// Resident memory: per module at most `instances` instances, each
	// within memory_mb plus twice max_output_bytes (the Extism kernel's
	// memory), plus a fixed overhead (the Go runtime, compiled code, the
	// stores).
	peak := peakRSS(t, p.cmd.Process.Pid)
	bound := int64(modules*instances*(memoryMB<<20+2*outputMB<<20) + overhead)
	t.Logf("host peak RSS %d MiB, bound %d MiB", peak>>20, bound>>20)
	require.Less(t, peak, bound, "peak RSS within the configured per-instance bounds plus overhead")
	require.Equal(t, 200, cmd("PlaceOrder", `{"order_id":"last","client_id":"c-1","total":1}`).code, "the host is still up")
}

// SIGHUPs that arrive while the host is still starting (its plugins are
// loaded, its consumers and HTTP server not yet started, or started and
// healthy while start returns) are not fatal: the host finishes its start
// and then reloads.
func TestSIGHUPDuringStartReloadsAfterIt(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	addr := freeAddr(t)
	tmp := t.TempDir()
	cfg := filepath.Join(tmp, "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf("[plugins]\ndir = %q\ncache_dir = %q\ncache_max_mb = 0\n[http]\nlisten = %q\n",
		dir, wasmbuild.CacheDir(t), addr)), 0o644))
	p := launchProcess(t, addr, cfg, tmp, nil)
	testwait.For(t, "the plugins to load", func() (bool, string) {
		return strings.Contains(p.Tail(), "plugins loaded"), p.Tail()
	})
	// SIGHUP on every turn until the host is healthy, so that some arrive
	// in the last steps of the start.
	testwait.For(t, "the host healthy, signaled all the while", func() (bool, string) {
		select {
		case <-p.done:
			return true, ""
		default:
		}
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		r, err := send("GET", "http://"+addr+"/healthz", "")
		return err == nil && r.code == 200, fmt.Sprintf("%v %v\n%s", r, err, p.Tail())
	})
	testwait.For(t, "the reload after the start", func() (bool, string) {
		select {
		case <-p.done:
			return true, ""
		default:
		}
		return strings.Contains(p.Tail(), "SIGHUP: reloading plugins"), p.Tail()
	})
	select {
	case <-p.done:
		t.Fatalf("the host exited on a SIGHUP during its start:\n%s", p.Tail())
	default:
	}
	r, err := send("POST", "http://"+addr+"/v1/commands/Increment", `{"id":"x"}`)
	require.NoError(t, err)
	require.Equal(t, 200, r.code, r.String())
}
