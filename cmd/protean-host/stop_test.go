package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// SIGTERM with a command and a delivery spinning in an uninterruptible
// module (neither can end on its own: the delivery loops forever, the
// command spins for ten minutes): the process drains for its
// --shutdown-timeout, cancels, leaves the two calls to its exit, and
// exits.
func TestRunExitsOnSIGTERMWhileUninterruptibleGuestsSpin(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	p := runHost(t, fmt.Sprintf(`
[databases.default]
provider = "memory"
[event_store]
provider = "memory"
[brokers.default]
provider = "inline"
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[plugins.limits]
interruptible = false
timeout_ms = 600000
max_host_calls = 1000000000 # the delivery polls a load forever
`, dir, wasmbuild.CacheDir(t)), "500ms")
	addr := p.addr

	// A delivery that loops forever: the event goes through the outbox and
	// the inline broker to the behave handler.
	r := do(t, "POST", "http://"+addr+"/v1/commands/EmitOp", `{"op":"spin","id":"d","arg":"never"}`)
	require.Equal(t, 200, r.code, r.String())
	// A command that spins for ten minutes; its answer never comes.
	go func() { _, _ = send("POST", "http://"+addr+"/v1/commands/Slow", `{"id":"a","ms":600000}`) }()
	testwait.For(t, "both guests in flight", func() (bool, string) {
		r, err := send("GET", "http://"+addr+"/metrics", "")
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, l := range strings.Split(r.raw, "\n") {
			if strings.HasPrefix(l, "protean_handler_calls_in_flight{") {
				seen = append(seen, l)
			}
		}
		return strings.Contains(r.raw, `protean_handler_calls_in_flight{handler="behave",module="behave"} 1`) &&
			strings.Contains(r.raw, `protean_handler_calls_in_flight{handler="slow",module="behave"} 1`), strings.Join(seen, "\n")
	})

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	testwait.For(t, "the host to exit after SIGTERM", func() (bool, string) {
		select {
		case <-p.done:
			return true, ""
		default:
			return false, p.Tail()
		}
	})
	log, err := os.ReadFile(p.log)
	require.NoError(t, err)
	require.Contains(t, string(log), "guest calls still running past the drain are left to the process's exit", "the engine abandoned the spinning calls")
	require.NotEqual(t, 0, p.cmd.ProcessState.ExitCode(), "a stop that abandoned work is not a clean exit")
}
