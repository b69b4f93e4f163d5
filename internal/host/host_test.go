package host_test

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

var loader *host.Loader

func TestMain(m *testing.M) {
	testserver.Main(m, func() {
		if loader != nil {
			_ = loader.Close(context.Background())
		}
	}, wasmbuild.Cleanup)
}

// sharedLoader returns the package's loader, on the shared compiled-code
// cache, so each module compiles once per run.
// generous gives lim's unset deadlines the suite's wait limit instead of
// the production defaults (a call 5 s, the manifest read at load 2 s, a
// compile 10 s per MiB). The manifest deadline covers instantiating the
// module and a call's covers creating an instance (a fresh one after an
// instance is discarded or recycled, or for each concurrent caller), which
// under -race on a loaded 2-core machine can take seconds; and a call
// waits for a free instance within its deadline. A test of a deadline
// sets that one.
func generous(lim host.Limits) host.Limits {
	lim.Timeout = cmp.Or(lim.Timeout, testwait.Limit())
	lim.ManifestTimeout = cmp.Or(lim.ManifestTimeout, testwait.Limit())
	lim.CompileTimeout = cmp.Or(lim.CompileTimeout, testwait.Limit())
	return lim
}

func sharedLoader(t testing.TB) *host.Loader {
	t.Helper()
	if loader == nil {
		// The tests of the deadlines themselves have their own loaders.
		l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		loader = l
	}
	return loader
}

func declared(t *testing.T, variant string) string {
	return wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant="+variant)
}

// setOf loads the given variants of the declared test module into one
// plugins directory and returns their declarations.
func setOf(t *testing.T, variants ...string) []host.Declared {
	t.Helper()
	dir := t.TempDir()
	for _, v := range variants {
		wasmbuild.Copy(t, declared(t, v), dir, v+".wasm")
	}
	mods, errs := sharedLoader(t).LoadDir(context.Background(), dir)
	require.Empty(t, errs)
	var out []host.Declared
	for _, m := range mods {
		t.Cleanup(func() { _ = m.Close(context.Background()) })
		out = append(out, host.Declared{File: m.File, Manifest: m.Manifest})
	}
	return out
}

var inline = host.Broker{Name: "default", Provider: "inline"}

func TestValidateRules(t *testing.T) {
	tests := []struct {
		name     string
		variants []string
		broker   host.Broker
		rule     host.Rule
		count    int // problems of rule expected; 0 means 1
		// every fragment must appear in some problem of rule
		want []string
	}{
		{name: "event handler lacks its key field", variants: []string{"event_handler_missing_field"},
			rule: host.RuleFieldExistence,
			want: []string{"event_handler_missing_field.wasm", "handler notify", "OrderPlaced", "no field client_id"}},
		{name: "command handler lacks its key field", variants: []string{"command_handler_missing_field"},
			rule: host.RuleFieldExistence,
			want: []string{"command_handler_missing_field.wasm", "handler orders", "command PlaceOrder", "no field client_id"}},
		{name: "process manager event lacks its correlate field", variants: []string{"pm_missing_correlate_field"},
			rule: host.RuleFieldExistence,
			want: []string{"pm_missing_correlate_field.wasm", "handler fulfillment", "PaymentRecorded", "no field order_id"}},
		{name: "two modules partition one category by different keys", variants: []string{"projector", "projector_by_order"},
			rule: host.RuleOneKey,
			want: []string{"stream category order", "client_id", "order_id", "by_client", "by_order", "projector.wasm"}},
		{name: "a process manager's correlate field counts as a key", variants: []string{"payment_by_id", "pm"},
			rule: host.RuleOneKey,
			want: []string{"stream category payment", "payment_id", "order_id", "fulfillment", "ledger"}},
		{name: "an event declaration of a partitioned category lacks the key", variants: []string{"projector", "unpartitioned_without_key"},
			rule: host.RuleEventKey,
			want: []string{"unpartitioned_without_key.wasm", "event OrderPlaced", "category order", "without field client_id", "by_client"}},
		{name: "a broker without partitioning", variants: []string{"projector", "pm"},
			broker: host.Broker{Name: "default", Provider: "kafka"}, rule: host.RuleBroker, count: 2,
			want: []string{"broker default", `"kafka"`, "STREAM_PARTITIONING", "projector.wasm", "categories: order", "pm.wasm", "categories: payment, shipping"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.broker
			if b.Provider == "" {
				b = inline
			}
			_, problems := host.Validate(setOf(t, tc.variants...), b)
			require.NotEmpty(t, problems)
			rules := map[host.Rule]int{}
			for _, p := range problems {
				rules[p.Rule]++
			}
			count := max(tc.count, 1)
			require.Equal(t, count, rules[tc.rule], "problems: %v", problems)
			var text []string
			for _, p := range problems {
				if p.Rule == tc.rule {
					text = append(text, p.Error())
				}
			}
			for _, w := range tc.want {
				require.Contains(t, strings.Join(text, "\n"), w)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	mods := setOf(t, "projector", "pm")
	for _, b := range []host.Broker{inline, {Name: "default", Provider: "redis", Capabilities: broker.StreamPartitioning}} {
		keys, problems := host.Validate(mods, b)
		require.Empty(t, problems, "broker %s", b.Provider)
		require.Equal(t, "client_id", keys["order"].Field)
		require.Equal(t, "order_id", keys["payment"].Field)
		require.Equal(t, "order_id", keys["shipping"].Field)
	}
	// A set with no partitioned handler runs on any broker.
	_, problems := host.Validate(setOf(t, "unpartitioned_without_key"), host.Broker{Name: "default", Provider: "kafka"})
	require.Empty(t, problems)
}

// Partitioning is the broker's capability, not its provider's name: the
// relay routes by the same bit, so validation cannot accept a set the relay
// would not partition, nor reject one it would.
func TestValidateDecidesPartitioningByCapability(t *testing.T) {
	mods := setOf(t, "projector")
	_, problems := host.Validate(mods, host.Broker{Name: "default", Provider: "redis"})
	require.NotEmpty(t, problems, "a redis provider without StreamPartitioning is refused")
	require.Equal(t, host.RuleBroker, problems[0].Rule)
	_, problems = host.Validate(mods, host.Broker{Name: "default", Provider: "kafka", Capabilities: broker.StreamPartitioning})
	require.Empty(t, problems, "any broker that advertises StreamPartitioning is accepted")
}

func TestValidateExamples(t *testing.T) {
	mods, errs := sharedLoader(t).LoadDir(context.Background(), wasmbuild.Examples(t))
	require.Empty(t, errs)
	var ds []host.Declared
	for _, m := range mods {
		ds = append(ds, host.Declared{File: m.File, Manifest: m.Manifest})
		defer m.Close(context.Background())
	}
	require.Len(t, ds, 5)
	keys, problems := host.Validate(ds, inline)
	require.Empty(t, problems)
	require.Equal(t, host.PartitionKey{Category: "order", Field: "client_id", File: "client_orders.wasm", Handler: "client_orders"}, keys["order"])
	require.Equal(t, "order_id", keys["payment"].Field)
	require.Equal(t, "order_id", keys["shipping"].Field)
	require.Equal(t, "fulfillment", keys["shipping"].Handler)
}

func TestABIVersionMismatch(t *testing.T) {
	m, err := sharedLoader(t).LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/raw", "variant=abi3"))
	require.NoError(t, err)
	defer m.Close(context.Background())
	_, problems := host.Validate([]host.Declared{{File: "future.wasm", Manifest: m.Manifest}}, inline)
	require.Len(t, problems, 1)
	require.Equal(t, host.RuleABIVersion, problems[0].Rule)
	require.Contains(t, problems[0].Error(), "future.wasm: module future is built for ABI v3; this host speaks ABI v1 to v2")
}

func TestHostileFiles(t *testing.T) {
	real, err := os.ReadFile(declared(t, "projector"))
	require.NoError(t, err)
	random := make([]byte, 4096)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	raw := func(v string) []byte {
		b, err := os.ReadFile(wasmbuild.Build(t, "./internal/host/testdata/plugins/raw", "variant="+v))
		require.NoError(t, err)
		return b
	}
	noexport, err := os.ReadFile(wasmbuild.Build(t, "./internal/host/testdata/plugins/noexport"))
	require.NoError(t, err)
	tests := []struct {
		name  string
		bytes []byte
		is    error
		want  string
	}{
		{"empty", nil, host.ErrEmptyFile, "empty file"},
		{"random", random, host.ErrNotWASM, "not a WebAssembly module"},
		{"truncated", real[:len(real)/2], host.ErrNotWASM, "not a WebAssembly module"},
		// A function section claiming four billion functions in five bytes:
		// wazero's decoder would size a 16 GiB table by the count.
		{"a count past its section", []byte("\x00asm\x01\x00\x00\x00\x03\x05\xff\xff\xff\xff\x0f"), host.ErrNotWASM, "claims 4294967295 entries in 0 bytes"},
		{"header only: a valid empty module", real[:8], host.ErrNoManifest, "does not export protean_manifest"},
		{"no manifest export", noexport, host.ErrNoManifest, "does not export protean_manifest"},
		{"malformed manifest", raw("malformed"), abi.ErrManifest, "invalid manifest"},
		{"oversized manifest", raw("huge"), abi.ErrManifest, "exceeds the 1048576-byte limit"},
		{"manifest never returns", raw("loop"), host.ErrManifestTimeout, "did not return in time"},
		{"manifest traps", raw("trap"), host.ErrTrap, "protean_manifest: module trapped: unreachable"},
		{"manifest reports failure", raw("fail"), host.ErrManifestFailed, "refusing on purpose"},
	}
	// A manifest that never returns must hit a deadline; a short one keeps
	// the test quick, and only a guest that loops forever meets it.
	short, err := host.NewLoader(host.LoaderOptions{Limits: host.Limits{ManifestTimeout: 500 * time.Millisecond}, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = short.Close(context.Background()) })
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := strings.ReplaceAll(tc.name, " ", "_") + ".wasm"
			path := filepath.Join(dir, file)
			require.NoError(t, os.WriteFile(path, tc.bytes, 0o644))
			l := sharedLoader(t)
			if errors.Is(tc.is, host.ErrManifestTimeout) {
				l = short
			}
			m, err := l.LoadFile(context.Background(), path)
			require.Nil(t, m)
			require.Error(t, err)
			var le *host.LoadError
			require.ErrorAs(t, err, &le)
			require.Equal(t, file, le.File)
			require.True(t, strings.HasPrefix(err.Error(), file+": "), err.Error())
			require.Contains(t, err.Error(), tc.want)
			if tc.is != nil {
				require.True(t, errors.Is(err, tc.is), "%v is not %v", err, tc.is)
			}
		})
	}
	// The host is still fine: a good module loads after all of that.
	m, err := sharedLoader(t).LoadFile(context.Background(), declared(t, "projector"))
	require.NoError(t, err)
	require.NoError(t, m.Close(context.Background()))
}

func TestLoadDirReportsEveryBadFile(t *testing.T) {
	dir := t.TempDir()
	wasmbuild.Copy(t, declared(t, "projector"), dir, "good.wasm")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.wasm"), []byte("nope"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "README.txt"), []byte("ignored"), 0o644))
	mods, errs := sharedLoader(t).LoadDir(context.Background(), dir)
	require.Len(t, mods, 1)
	require.Len(t, errs, 1)
	require.Contains(t, errs[0].Error(), "bad.wasm: not a WebAssembly module")
	require.NoError(t, mods[0].Close(context.Background()))

	_, errs = sharedLoader(t).LoadDir(context.Background(), t.TempDir())
	require.ErrorContains(t, errs[0], "no *.wasm files")
	_, errs = sharedLoader(t).LoadDir(context.Background(), filepath.Join(dir, "missing"))
	require.ErrorContains(t, errs[0], "plugins directory")
}
