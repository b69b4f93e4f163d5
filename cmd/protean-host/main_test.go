package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// configFile writes a config over the embedded default with the broker
// given and the tests' shared compile cache. Every test config on that
// cache sets cache_max_mb = 0: it is shared by test processes (make test's
// plain and race passes), and a bounded host would prune what the others
// compiled, costing them a compile each (~15 s under -race).
func configFile(t *testing.T, broker string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "domain.toml")
	require.NoError(t, os.WriteFile(p, []byte(`
[brokers.default]
provider = "`+broker+`"
[plugins]
cache_dir = "`+wasmbuild.CacheDir(t)+`"
cache_max_mb = 0
`), 0o644))
	return p
}

func TestValidateExamples(t *testing.T) {
	dir := wasmbuild.Examples(t)
	code, out, errs := cli(t, "validate", "--config", configFile(t, "inline"), "--plugins", dir)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, regexp.MustCompile(`(?m)^client_orders\.wasm\s+1\.0\.0\s+client_orders\s+projector\s+order\s+order by client_id$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^fulfillment\.wasm\s+1\.0\.0\s+fulfillment\s+process_manager\s+payment, shipping\s+payment by order_id, shipping by order_id \(correlate\)$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^orders\.wasm\s+1\.0\.0\s+orders\s+command_handler\s+order\s+order by client_id$`), out,
		"a command handler writes its category under the key the category has")
	require.Contains(t, out, "5 modules, 5 handlers: valid")

	// The same set on a broker without partitioning is refused, naming the
	// modules and categories.
	code, _, errs = cli(t, "validate", "--config", configFile(t, "kafka"), "--plugins", dir)
	require.Equal(t, 1, code)
	require.Contains(t, errs, `client_orders.wasm: broker default (provider "kafka") does not advertise STREAM_PARTITIONING`)
	require.Contains(t, errs, "fulfillment.wasm: broker default")
	require.Contains(t, errs, "offending categories: payment, shipping")
}

func TestValidateReportsEveryProblem(t *testing.T) {
	dir := wasmbuild.Examples(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644))
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector_by_order"), dir, "by_order.wasm")
	code, out, errs := cli(t, "validate", "--config", configFile(t, "inline"), "--plugins", dir)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errs, "junk.wasm: not a WebAssembly module")
	require.Contains(t, errs, "stream category order is partitioned by conflicting keys: order_id (from handler by_order in by_order.wasm) and client_id (from handler client_orders (projector))")
	require.Contains(t, errs, "2 problem(s)")
}

func TestUsageAndBadFlags(t *testing.T) {
	code, _, errs := cli(t)
	require.Equal(t, 2, code)
	require.Contains(t, errs, "usage: protean-host")
	code, _, errs = cli(t, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errs, `unknown command "frobnicate"`)
	code, _, errs = cli(t, "validate", "--config", filepath.Join(t.TempDir(), "missing.toml"))
	require.Equal(t, 1, code)
	require.Contains(t, errs, "missing.toml")
	bad := filepath.Join(t.TempDir(), "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[server.partitioning]\nlease_ttl_ms = 0\n"), 0o644))
	code, _, errs = cli(t, "validate", "--config", bad)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "server.partitioning.lease_ttl_ms must be > 0")
}

// The command line keeps the conventions of its ecosystem (rpk, kubectl):
// help at every level on stdout with status 0, one line naming a usage
// error (and where the help is) on stderr with status 2, and each
// subcommand's own flags.
func TestCLIConventions(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"help", "outbox"}, {"outbox", "--help"}, {"outbox", "retry", "--help"}, {"plugin", "--help"},
		{"plugin", "test", "--help"}, {"keys", "--help"}, {"keys", "new", "--help"}, {"migrate", "--help"}, {"run", "--help"},
		{"subscriptions", "retry", "--help"}, {"subscriptions", "--help"}, {"partitions", "list", "--help"}, {"dead-letters", "--help"},
		{"audit", "--help"}, {"version", "--help"},
	} {
		code, out, errs := cli(t, args...)
		require.Equal(t, 0, code, "%v: %s", args, errs)
		require.NotEmpty(t, out, "%v: help on stdout", args)
		require.Empty(t, errs, "%v: nothing on stderr", args)
	}
	flags := func(args ...string) string {
		_, out, _ := cli(t, args...)
		_, fl, ok := strings.Cut(out, "\nflags:\n")
		require.True(t, ok, "%v: %s", args, out)
		return fl
	}
	require.NotContains(t, flags("subscriptions", "retry", "--help"), "-all", "retry's flags, not failed's")
	require.Contains(t, flags("subscriptions", "retry", "--help"), "-reason")
	require.Contains(t, flags("subscriptions", "failed", "--help"), "-all")
	require.NotContains(t, flags("subscriptions", "failed", "--help"), "-reason")
	var out string
	_, out, _ = cli(t, "migrate", "--help")
	require.NotContains(t, out, "-plugins", "migrate loads no plugins")
	_, out, _ = cli(t, "help", "outbox")
	require.Contains(t, out, "outbox status")

	for _, c := range []struct {
		args []string
		line string
	}{
		{[]string{"run", "--bogus"}, "protean-host run: flag provided but not defined: -bogus"},
		{[]string{"outbox", "bogus"}, "protean-host outbox: usage: protean-host outbox status"},
		{[]string{"outbox", "retry", "x"}, `protean-host outbox: outbox row ID "x" must be a positive integer`},
		{[]string{"plugin", "bogus"}, `protean-host plugin: unknown subcommand "bogus"`},
		{[]string{"subscriptions", "retry", "--all"}, "protean-host subscriptions: flag provided but not defined: -all"},
		{[]string{"subscriptions", "retry", "g"}, "protean-host subscriptions: subscriptions retry takes 3 arguments, got 1"},
		{[]string{"outbox", "status", "-o", "yaml"}, `protean-host outbox: -o "yaml": the output is text or json`},
		{[]string{"keys", "new", "acme"}, "protean-host keys: --role"},
	} {
		code, out, errs := cli(t, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errs)
		require.Empty(t, out, "%v", c.args)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		require.True(t, strings.HasPrefix(lines[0], c.line), "%v: %q", c.args, errs)
		require.Equal(t, fmt.Sprintf("(protean-host %s --help tells how to use it)", c.args[0]), lines[len(lines)-1], "%v", c.args)
		require.Equal(t, 1, strings.Count(errs, "protean-host "+c.args[0]+": "), "%v: one error message, not two: %q", c.args, errs)
	}
	code, _, errs := cli(t, "validate", "--config", filepath.Join(t.TempDir(), "missing.toml"))
	require.Equal(t, 1, code, "an operational failure: %s", errs)
}
