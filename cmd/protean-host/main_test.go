package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
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
